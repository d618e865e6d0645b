"""Hostile commands against every sandbox backend: each must be contained, and leave nothing.

The ``make`` fixture closes every sandbox after the test and fails it if a process, cgroup or
host directory of the sandbox is left behind.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import SandboxError
from sandboxes._disk import backing_file
from tests.sandboxes.conftest import (
    MakeSandbox,
    disk_cap_ready,
    local_ready,
    marked_processes,
    read_until,
)


async def test_host_secrets_are_hidden(make: MakeSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("hunter2")
    sb = await make()
    r = await sb.exec(f"ls /root; cat {secret}; cat /etc/shadow; ls /home", timeout_s=10)
    assert "hunter2" not in r.output
    with pytest.raises(FileNotFoundError):
        await sb.read_file(str(secret))


async def test_other_sandbox_workspace_is_hidden(make: MakeSandbox) -> None:
    a = await make()
    b = await make()
    await b.write_file("secret.txt", "b-only-token")
    host_path = Path(getattr(b, "home", "/nonexistent")) / "ws" / "secret.txt"
    r = await a.exec(
        f"cat {host_path}; ls {host_path.parent.parent.parent}; "
        "find / -path /proc -prune -o -name secret.txt -print; echo done",
        timeout_s=60,
    )
    assert "b-only-token" not in r.stdout and "secret.txt" not in r.stdout, r.stdout
    assert r.stdout.strip().endswith("done")


async def test_other_processes_are_hidden(make: MakeSandbox) -> None:
    env = {**os.environ, "HOST_SECRET_TOKEN": "s3cr3t-env-value"}
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        sb = await make()
        r = await sb.exec(
            f"cat /proc/{host.pid}/environ; cat /proc/*/environ | tr '\\0' '\\n'; ls /proc",
            timeout_s=10,
        )
        assert "s3cr3t-env-value" not in r.output
        assert str(host.pid) not in r.stdout.split()
        r = await sb.exec("env", timeout_s=10)
        assert "HOST_SECRET_TOKEN" not in r.stdout
    finally:
        host.kill()
        host.wait()


async def test_host_is_read_only(make: MakeSandbox) -> None:
    sb = await make()
    before = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
    r = await sb.exec("echo pwned > /etc/hostname; touch /usr/pwned; mkdir /pwned", timeout_s=10)
    assert r.exit_code != 0
    assert not Path("/usr/pwned").exists() and not Path("/pwned").exists()
    if before:
        assert Path("/etc/hostname").read_bytes() == before
    with pytest.raises(SandboxError):
        await sb.write_file("/usr/pwned2", "x")
    await sb.write_file("ok.txt", "inside")  # the workspace itself is writable
    assert await sb.read_file("ok.txt") == b"inside"


async def test_symlink_to_host_file_does_not_leak_through_file_api(
    make: MakeSandbox, tmp_path: Path
) -> None:
    secret = tmp_path / "host-only.txt"
    secret.write_text("host-only-data")
    sb = await make()
    await sb.exec(f"ln -s {secret} link && ln -s /etc/shadow shadow", timeout_s=10)
    with pytest.raises(FileNotFoundError):
        await sb.read_file("link")
    with pytest.raises(PermissionError):
        await sb.read_file("shadow")
    with pytest.raises(SandboxError, match="refusing"):  # a link out of the tree is not extracted
        await sb.download("link", tmp_path / "downloaded")
    assert not (tmp_path / "downloaded").exists()


async def test_fork_bomb_is_contained(make: MakeSandbox) -> None:
    sb = await make(pids_max=64)
    r = await sb.exec(":(){ :|:& };:", timeout_s=5)
    assert r.exit_code != 0 or r.timed_out
    after = await sb.exec("echo still-alive", timeout_s=10)
    assert after.stdout == "still-alive\n"


async def test_memory_hog_is_killed(make: MakeSandbox) -> None:
    sb = await make(memory_mb=128)
    r = await sb.exec(["python3", "-c", "x = bytearray(1 << 30); print('allocated')"], timeout_s=30)
    assert r.exit_code != 0
    assert "allocated" not in r.stdout
    assert r.oom_killed
    assert (await sb.exec("echo ok", timeout_s=10)).stdout == "ok\n"


async def test_infinite_loop_times_out_and_leaves_nothing(make: MakeSandbox) -> None:
    sb = await make()
    r = await sb.exec("sh -c 'while :; do :; done' & while :; do :; done", timeout_s=1)
    assert r.timed_out and r.exit_code == -1
    assert marked_processes(sb.name) == []


async def test_cpu_time_limit(make: MakeSandbox) -> None:
    sb = await make(cpu_time_s=1)
    r = await sb.exec(["python3", "-c", "while True: pass"], timeout_s=60)
    assert not r.timed_out
    assert r.exit_code != 0


async def test_huge_output_is_capped(make: MakeSandbox) -> None:
    sb = await make(max_output_bytes=4096)
    r = await sb.exec("head -c 50000000 /dev/zero | tr '\\0' a; echo END", timeout_s=60)
    assert r.truncated
    assert len(r.stdout) < 4096 + 100
    assert "bytes truncated" in r.stdout
    assert r.stdout.endswith("END\n")  # the tail is kept
    endless = await sb.exec("yes", timeout_s=1)
    assert endless.timed_out and endless.truncated and len(endless.stdout) < 4096 + 100


async def test_big_file_hits_size_limit(make: MakeSandbox) -> None:
    sb = await make(file_size_mb=16)
    r = await sb.exec("head -c 2G /dev/zero > big.bin; stat -c %s big.bin", timeout_s=60)
    size = int(r.stdout.split()[-1])
    assert size <= 16 << 20


async def _loopback_server() -> tuple[asyncio.Server, int, list[bool]]:
    hits: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(True)
        writer.write(b"hello from host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], hits


CONNECT = "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3); print(s.recv(100).decode())"


async def test_no_network_by_default(make: MakeSandbox) -> None:
    server, port, hits = await _loopback_server()
    async with server:
        sb = await make()
        r = await sb.exec(["python3", "-c", CONNECT, str(port)], timeout_s=20)
        assert r.exit_code != 0
        assert "hello from host" not in r.stdout
        assert hits == []


async def test_network_when_allowed(make: MakeSandbox) -> None:
    server, port, hits = await _loopback_server()
    async with server:
        sb = await make(allow_network=True)
        r = await sb.exec(["python3", "-c", CONNECT, str(port)], timeout_s=20)
        assert "hello from host" in r.stdout, r.stderr
        assert hits == [True]


async def test_background_processes_do_not_outlive_exec(make: MakeSandbox) -> None:
    sb = await make()
    r = await sb.exec(
        "sleep 1000 & setsid sleep 1001 & (nohup sleep 1002 >/dev/null 2>&1 &); echo started",
        timeout_s=10,
    )
    assert r.stdout == "started\n"
    assert marked_processes(sb.name) == []


async def test_background_process_of_session_dies_at_close(make: MakeSandbox) -> None:
    sb = await make()
    proc = await sb.start_process(["/bin/sh"])
    await proc.write(b"setsid sleep 1000 & sleep 1001 & echo ready\n")
    assert b"ready" in await read_until(proc, b"ready")
    assert len(marked_processes(sb.name)) >= 2
    await sb.close()
    assert marked_processes(sb.name) == []
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_killing_own_parents_is_harmless(make: MakeSandbox) -> None:
    sb = await make()
    r = await sb.exec("kill -9 $PPID; kill -9 1; sleep 1; echo survived", timeout_s=10)
    assert not r.timed_out
    assert (await sb.exec("echo next", timeout_s=10)).stdout == "next\n"


async def test_commands_cannot_reach_the_exec_agents_pipes(make: MakeSandbox) -> None:
    """Only fds 0-2 are open in a command: no report pipe to forge (``P 1`` once made the
    local agent SIGKILL its own namespace's init), no frame pipe to the host."""
    sb = await make()
    r = await sb.exec("ls /proc/self/fd", timeout_s=10)
    assert r.stdout.split() == ["0", "1", "2", "3"], r.stdout  # 3: ls's own listing of the dir
    forge = "printf 'P 1\nS 0\nP x\n' >&3; printf 'garbage' >&4; echo tried"
    r = await sb.exec(forge, timeout_s=10)
    assert "Bad file descriptor" in r.stderr and r.stdout == "tried\n"
    agent = getattr(sb, "_agent", None)
    pid_before = agent.agent.cmd.proc.pid if agent is not None and agent.agent else None
    for _ in range(3):
        assert (await sb.exec("echo ok", timeout_s=10)).stdout == "ok\n"
    if pid_before is not None:  # the same agent still serves the sandbox
        assert agent is not None and agent.agent is not None
        assert agent.agent.cmd.proc.pid == pid_before


PROCS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"


async def test_no_background_process_reaches_the_next_exec(make: MakeSandbox) -> None:
    """Double forks, new sessions, a cleared environment (no marker to find it by) and a
    killed parent chain: nothing started by one exec is alive in the next."""
    sb = await make()
    r = await sb.exec(
        "(setsid sleep 1000 &); env -i sleep 1001 & (env -i setsid sleep 1002 &); "
        "grand=$(cut -d' ' -f4 /proc/$PPID/stat); echo started; kill -9 $grand $PPID",
        timeout_s=10,
    )
    assert "started" in r.stdout
    listing = (await sb.exec(PROCS, timeout_s=10)).stdout
    assert "sleep 100" not in listing, listing
    assert marked_processes(sb.name) == []


SYSCALLS = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"ptrace": (101, 0, 0, 0, 0), "unshare": (272, 0x10000000), "setns": (308, 0, 0),
      "unshare_newpid": (272, 0x20000000),
      "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0), "keyctl": (250, 0, 0, 0, 0, 0),
      "add_key": (248, b"user", b"k", b"v", 1, 0xFFFFFFFD), "bpf": (321, 0, 0, 0),
      "perf_event_open": (298, 0, 0, -1, -1, 0), "kexec_load": (246, 0, 0, 0, 0),
      "userfaultfd": (323, 0), "clone3": (435, 0, 0), "clone_newuser": (56, 0x10000011, 0, 0, 0, 0)}
for name in sys.argv[1:]:
    nr, *args = NR[name]
    r = libc.syscall(nr, *args)
    if r == 0 and name.startswith("clone"):
        os._exit(0)
    print(name, r, ctypes.get_errno() if r < 0 else 0)
"""
DOCKER_BLOCKS = [
    "unshare",
    "unshare_newpid",
    "setns",
    "mount",
    "keyctl",
    "add_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "clone3",
    "clone_newuser",
]


async def test_dangerous_syscalls_are_refused(make: MakeSandbox, backend: str) -> None:
    """What Docker's default seccomp profile refuses, the local backend's filter refuses too
    (and ptrace, userfaultfd); clone3 is ENOSYS so that libc falls back to clone. A bare
    unshare(CLONE_NEWPID) passes the local filter (the exec agent needs it) but the kernel
    refuses it: commands have no CAP_SYS_ADMIN."""
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers below are x86_64's")
    sb = await make()
    await sb.write_file("sc.py", SYSCALLS)
    names = DOCKER_BLOCKS + (["ptrace", "userfaultfd"] if backend == "local" else [])
    r = await sb.exec(["python3", "sc.py", *names], timeout_s=30)
    got = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
    assert sorted(got) == sorted(names), r.stdout + r.stderr
    for name, (ret, err) in got.items():
        want = "38" if name == "clone3" else "1"  # ENOSYS, EPERM
        assert (ret, err) == ("-1", want), f"{name}: returned {ret}, errno {err}"
    r = await sb.exec("unshare -r true; echo rc=$?", timeout_s=30)  # no nested user namespace
    assert "rc=0" not in r.stdout
    r = await sb.exec(
        "python3 -c 'import threading; t = threading.Thread(target=print, args=(7,)); t.start(); t.join()'",
        timeout_s=30,
    )
    assert r.stdout == "7\n"  # threads and fork still work (clone without namespace flags)


@pytest.mark.parametrize("backend", ["local"])  # Docker's profile allows the i386 ABI
@pytest.mark.skipif(
    os.uname().machine != "x86_64" or local_ready() is not None,
    reason="the local backend's filter, on x86_64",
)
async def test_other_syscall_abis_are_killed(make: MakeSandbox) -> None:
    """An i386 syscall (int 0x80) from a 64-bit process could dodge a filter written for
    x86_64 numbers; the local filter kills the process instead."""
    sb = await make()
    code = (
        "import ctypes, mmap\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(bytes.fromhex('b814000000cd80c3'))  # mov eax, 20 (getpid); int 0x80; ret\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
        "print('pid', f())\n"
    )
    r = await sb.exec(["python3", "-c", code], timeout_s=30)
    assert "pid" not in r.stdout and r.exit_code == 128 + 31, (r.exit_code, r.stdout, r.stderr)


async def test_disk_cap_holds_for_workspace_and_tmp(make: MakeSandbox, backend: str) -> None:
    """Many files each under the per-file limit cannot fill the host disk: the writable space
    is its own filesystem of ``disk_mb`` (the workspace and, on local, /tmp)."""
    if why := disk_cap_ready():
        pytest.skip(why)
    sb = await make(disk_mb=32, file_size_mb=64)
    tmp_too = "/tmp/b" if backend == "local" else "c"
    r = await sb.exec(
        f"head -c 20M /dev/zero > a; head -c 20M /dev/zero > {tmp_too}; echo rc=$?", timeout_s=60
    )
    assert "No space left on device" in r.stderr and "rc=1" in r.stdout, r
    await sb.exec(f"rm -f a {tmp_too}", timeout_s=10)
    with pytest.raises(SandboxError, match=r"No space left.*disk_mb=32"):
        await sb.write_file("big.bin", b"\0" * (33 << 20))  # the cap + 1 MiB
    home = Path(getattr(sb, "home", ""))
    used = sum(p.stat().st_blocks * 512 for p in home.rglob("*") if p.is_file())
    assert used <= 32 << 20
    image = backing_file(home)
    assert image is not None and image == home.with_name(home.name + ".img")
    assert image.stat().st_blocks * 512 <= 33 << 20  # sparse: what was written, at most
    await sb.exec("rm -f big.bin", timeout_s=10)
    await sb.write_file("small.txt", "fits")  # space comes back
    assert await sb.read_file("small.txt") == b"fits"


SIGNAL_ALL = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
me, hits = int(os.readlink("/proc/self")), []  # our pid as this /proc numbers it
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == me:
        continue
    try:
        os.kill(int(d), signal.SIGKILL)
        hits.append("kill " + d)
    except OSError:
        pass
    try:  # a /proc/<pid> directory fd works as a pidfd for pidfd_send_signal
        fd = os.open("/proc/" + d, os.O_RDONLY | os.O_DIRECTORY)
        if libc.syscall(424, fd, signal.SIGKILL, None, 0) == 0:
            hits.append("pidfd " + d)
        os.close(fd)
    except OSError:
        pass
print("tried", len(os.listdir("/proc")), "hits", " ".join(hits))
"""


async def test_signals_cannot_reach_the_agent_or_init(make: MakeSandbox) -> None:
    """SIGKILL to every pid in /proc, by number and through /proc/<pid> descriptors: the exec
    agent (local) and the container's init (docker) survive, and the sandbox still works."""
    sb = await make()
    slot = getattr(sb, "_agent", None)
    agent_pid = slot.agent.cmd.proc.pid if slot is not None and slot.agent else None
    await sb.write_file("sig.py", SIGNAL_ALL)
    r = await sb.exec(["python3", "sig.py"], timeout_s=30)
    assert "tried" in r.stdout, r.stderr
    for _ in range(3):
        assert (await sb.exec("echo alive", timeout_s=10)).stdout == "alive\n"
    if agent_pid is not None:
        assert slot is not None and slot.agent is not None and slot.agent.cmd.proc.pid == agent_pid
    assert await sb.is_alive()


async def test_host_information_through_proc_and_sys(make: MakeSandbox, backend: str) -> None:
    """/proc lists only the sandbox's processes, /proc and /sys are read-only, kernel
    addresses read as zero, and (local) /sys is not there at all. The kernel's version and
    the machine's CPU and memory totals stay visible (a shared kernel; see the threat model)."""
    sb = await make()
    writes = [
        "/proc/sysrq-trigger",
        "/proc/sys/kernel/sysrq",
        "/sys/kernel/uevent_helper",
        "/proc/sys/vm/drop_caches",
    ]
    r = await sb.exec(
        "".join(f"(echo 1 > {w}) 2>/dev/null && echo WROTE {w}; " for w in writes)
        + "head -c 1 /proc/kcore 2>/dev/null && echo READ kcore; "
        "grep -v '^0000000000000000' /proc/kallsyms 2>/dev/null | head -3; echo done",
        timeout_s=30,
    )
    assert r.stdout == "done\n", r.stdout
    sys_listing = (await sb.exec("ls /sys", timeout_s=10)).stdout.split()
    if backend == "local":
        assert sys_listing == []  # not mounted at all
    pids = (await sb.exec("ls /proc | grep -c '^[0-9]'", timeout_s=10)).stdout.strip()
    assert int(pids) < 16  # the sandbox's own few processes, never the host's hundreds


async def test_zombies_of_a_command_are_reaped(make: MakeSandbox) -> None:
    sb = await make(pids_max=128)
    script = (
        "import os, time\n"
        "for _ in range(100):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "print('zombies', len([d for d in os.listdir('/proc') if d.isdigit()]))\n"
    )
    r = await sb.exec(["python3", "-c", script], timeout_s=30)
    assert "zombies" in r.stdout, r.stderr
    count = "grep -l '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat 2>/dev/null | wc -l"
    assert (await sb.exec(count, timeout_s=10)).stdout.strip() == "0"
    usage = await sb.pids_in_use()
    assert usage is None or usage[0] < 16
