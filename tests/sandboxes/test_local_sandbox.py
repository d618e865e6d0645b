"""LocalSandbox behaviour: commands, files, snapshots, fallbacks, and sweeping a killed run."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from agentrl.errors import ConfigError, SandboxError, UnknownIdError
from agentrl.sandbox import make_sandbox, sweep
from sandboxes import _cgroup, _host
from tests.sandboxes.conftest import (
    MakeSandbox,
    disk_cap_ready,
    local_ready,
    marked_processes,
    read_until,
)

pytestmark = pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))


@pytest.fixture
def backend() -> str:
    return "local"


async def test_exec_cwd_env_stdin(make: MakeSandbox) -> None:
    sb = await make(env={"FROM_CONFIG": "cfg"})
    await sb.exec("mkdir -p sub/dir", timeout_s=10)
    r = await sb.exec(
        "pwd; echo $FROM_CONFIG $FROM_CALL; cat",
        cwd="sub/dir",
        env={"FROM_CALL": "call"},
        stdin="piped\n",
        timeout_s=10,
    )
    assert r.stdout == f"{sb.workdir}/sub/dir\ncfg call\npiped\n"
    r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)


async def test_files_round_trip(make: MakeSandbox, tmp_path: Path) -> None:
    sb = await make()
    blob = bytes(range(256)) * 100
    await sb.write_file("deep/dir/blob.bin", blob)
    assert await sb.read_file(f"{sb.workdir}/deep/dir/blob.bin") == blob
    await sb.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert (await sb.exec("./run.sh", timeout_s=10)).stdout == "ran\n"
    with pytest.raises(FileNotFoundError):
        await sb.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        await sb.read_file("deep")

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "top.txt").write_text("top\n")
    await sb.upload(src, "project")
    await sb.upload(src / "top.txt", "single/top.txt")
    r = await sb.exec("cat project/pkg/mod.py single/top.txt", timeout_s=10)
    assert r.stdout == "X = 1\ntop\n"
    await sb.exec("echo changed > project/top.txt", timeout_s=10)
    await sb.download("project", tmp_path / "back")
    assert (tmp_path / "back" / "top.txt").read_text() == "changed\n"
    assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "X = 1\n"
    await sb.download("single/top.txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == "top\n"


async def test_read_file_size_cap(make: MakeSandbox) -> None:
    sb = await make(max_file_bytes=1000)
    await sb.exec("head -c 5000 /dev/zero > big", timeout_s=10)
    with pytest.raises(SandboxError, match="max_file_bytes"):
        await sb.read_file("big")


async def test_template_and_snapshot_are_independent_copies(
    make: MakeSandbox, tmp_path: Path
) -> None:
    template = tmp_path / "repo"
    template.mkdir()
    (template / "a.py").write_text("print('v1')\n")
    sb = await make(template_dir=str(template))
    assert (await sb.exec("python3 a.py", timeout_s=10)).stdout == "v1\n"
    await sb.write_file("a.py", "print('v2')\n")  # template files are writable by the sandbox
    snap = await sb.snapshot()
    try:
        await sb.write_file("a.py", "print('v3')\n")
        assert (await snap.exec("python3 a.py", timeout_s=10)).stdout == "v2\n"
        assert snap.name.startswith(sb.name)  # same run prefix: sweep() finds snapshots too
    finally:
        await snap.close()
    assert (template / "a.py").read_text() == "print('v1')\n"


async def test_close_is_idempotent_and_final(make: MakeSandbox) -> None:
    sb = await make()
    assert await sb.is_alive()
    await sb.close()
    await sb.close()
    assert not await sb.is_alive()
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


async def test_interrupt_keeps_the_process(make: MakeSandbox) -> None:
    sb = await make()
    proc = await sb.start_process(["/bin/sh"])
    await proc.write(b"sleep 1000; echo after-interrupt\n")
    await asyncio.sleep(0.3)
    await proc.interrupt()
    assert b"after-interrupt" in await read_until(proc, b"after-interrupt")
    assert proc.alive
    await proc.kill()
    assert not proc.alive


async def test_fallback_without_isolation_warns_and_still_limits(
    make: MakeSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    _host._warned.clear()
    with caplog.at_level(logging.WARNING, logger="sandboxes._host"):
        sb = await make(use_bwrap=False, use_cgroups=False)
    assert "no bubblewrap" in caplog.text and "no cgroups" in caplog.text
    r = await sb.exec("pwd; sleep 1000 & (setsid sleep 1001 &); while :; do :; done", timeout_s=1)
    assert r.timed_out
    assert r.stdout.strip() == sb.workdir
    assert marked_processes(sb.name) == []
    r = await sb.exec("id -u", timeout_s=10)
    if os.geteuid() == 0:
        assert r.stdout.strip() == "65534"


async def test_require_isolation_raises_instead_of_falling_back(make: MakeSandbox) -> None:
    with pytest.raises(SandboxError, match="bubblewrap"):
        await make(use_bwrap=False, require_isolation=True)


async def test_registry_and_config_errors() -> None:
    with pytest.raises(UnknownIdError, match="Did you mean 'local'"):
        await make_sandbox("locl")
    with pytest.raises(ConfigError, match="memory_md"):
        await make_sandbox("local", memory_md=1)
    with pytest.raises(ConfigError, match="too short"):
        await sweep("local", "a")


def name_of(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:  # exited meanwhile
        return ""


KILLED_RUN = textwrap.dedent(
    """
    import asyncio, os, sys
    from agentrl.sandbox import make_sandbox, new_name
    async def main():
        for use_bwrap in (True, False):
            sb = await make_sandbox("local", name=new_name(sys.argv[1]), root_dir=sys.argv[2],
                                    use_bwrap=use_bwrap)
            p = await sb.start_process(["/bin/sh"])
            await p.write(b"sleep 1000 & setsid sleep 1001 & echo up\\n")
            await p.read()
        print("ready", flush=True)
        os._exit(0)  # die without closing anything
    asyncio.run(main())
    """
)


async def test_sweep_removes_leftovers_of_a_killed_run(sandbox_root: str) -> None:
    from sandboxes.local import LocalSandbox

    prefix = f"agentrl-killed{os.getpid()}-"
    try:
        out = subprocess.run(
            [sys.executable, "-c", KILLED_RUN, prefix, sandbox_root],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "ready" in out.stdout, out.stderr
        # bwrap's processes die with their parent; the unwrapped sandbox's are left behind.
        # Bounded wait: the kernel delivers parent-death signals asynchronously, and on a
        # loaded machine the background jobs may not have exec'd `sleep` yet (still sh/setsid).
        for _ in range(1000):
            names = [name_of(p) for p in marked_processes(prefix)]
            if "bwrap" not in names and "sleep" in names:
                break
            await asyncio.sleep(0.01)
        assert "sleep" in names and "bwrap" not in names
        homes = [p for p in Path(sandbox_root).iterdir() if p.name.startswith(prefix)]
        assert sum(p.is_dir() for p in homes) == 2  # and their disk images, p.img
    finally:  # the sweep under test also keeps a failed run from leaking
        report = await sweep("local", prefix, LocalSandbox.Config(root_dir=sandbox_root))

    assert report.processes >= 2 and report.dirs == 2
    assert marked_processes(prefix) == []
    assert not any(p.name.startswith(prefix) for p in Path(sandbox_root).iterdir())
    if _cgroup.version() is not None:
        assert report.cgroups >= 2
        leftover = [d for base in _cgroup._bases("agentrl") for d in base.glob(prefix + "*")]
        assert leftover == []


async def test_sandbox_root_is_masked_when_under_a_visible_path(
    make: MakeSandbox, sandbox_root: str
) -> None:
    from sandboxes.local import LocalSandbox

    a = await make(ro_paths=[*LocalSandbox.Config().ro_paths, sandbox_root])
    b = await make()
    await b.write_file("secret.txt", "b-only")
    r = await a.exec(
        f"ls -A {sandbox_root}; cat {sandbox_root}/{b.name}/ws/secret.txt", timeout_s=10
    )
    assert "b-only" not in r.stdout
    assert r.stdout.strip() == ""


KILLED_WITH_DISK = textwrap.dedent(
    """
    import asyncio, os, sys
    from agentrl.sandbox import make_sandbox, new_name
    async def main():
        sb = await make_sandbox("local", name=new_name(sys.argv[1]), root_dir=sys.argv[2],
                                disk_mb=16)
        await sb.write_file("f.txt", "x")
        print("ready", sb.home, flush=True)
        os._exit(0)  # die with the capped filesystem still mounted
    asyncio.run(main())
    """
)


@pytest.mark.skipif(disk_cap_ready() is not None, reason=str(disk_cap_ready()))
async def test_sweep_unmounts_the_capped_disk_of_a_killed_run(sandbox_root: str) -> None:
    from sandboxes.local import LocalSandbox

    prefix = f"agentrl-kdisk{os.getpid()}-"
    try:
        out = subprocess.run(
            [sys.executable, "-c", KILLED_WITH_DISK, prefix, sandbox_root],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "ready" in out.stdout, out.stderr
        home = Path(out.stdout.split()[1])
        assert os.path.ismount(home) and home.with_name(home.name + ".img").exists()
    finally:
        report = await sweep("local", prefix, LocalSandbox.Config(root_dir=sandbox_root))
    assert report.dirs == 1
    assert not os.path.ismount(home) and not home.exists()
    assert not home.with_name(home.name + ".img").exists()
    assert str(home) not in Path("/proc/mounts").read_text()


@pytest.mark.skipif(disk_cap_ready() is not None, reason=str(disk_cap_ready()))
async def test_disk_cap_is_on_by_default_and_never_shared(make: MakeSandbox) -> None:
    """The defaults cap the writable space (workspace and /tmp on one filesystem of
    DEFAULT_DISK_MB); homes made from spare filesystems prepared ahead are each their own."""
    from sandboxes import _disk
    from sandboxes.local import DEFAULT_DISK_MB, LocalSandbox

    boxes = [await make() for _ in range(3)]  # the 2nd and 3rd use spares made meanwhile
    devices = set()
    for sb in boxes:
        assert isinstance(sb, LocalSandbox) and sb.disk_mb == DEFAULT_DISK_MB
        r = await sb.exec(
            "df -k /workspace /tmp | tail -2; stat -c %d /workspace /tmp", timeout_s=10
        )
        sizes = [int(line.split()[1]) for line in r.stdout.splitlines()[:2]]
        assert all(0.9 * (DEFAULT_DISK_MB << 10) < k <= DEFAULT_DISK_MB << 10 for k in sizes), r
        ws_dev, tmp_dev = r.stdout.split()[-2:]
        assert ws_dev == tmp_dev  # one cap for both
        home = sb.home
        devices.add(os.stat(home).st_dev)
        assert _disk.backing_file(home) == home.with_name(home.name + ".img")
        assert not (home / "lost+found").exists()
    assert len(devices) == 3
    await boxes[0].write_file("only-here.txt", "x")
    assert (await boxes[1].exec("ls", timeout_s=10)).stdout == ""


@pytest.mark.skipif(disk_cap_ready() is not None, reason=str(disk_cap_ready()))
def test_disk_template_is_remade_where_its_directory_went_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template directory is checked on every call, not once per process: after the
    temp directory moves (or a temp cleaner removes it) new sandboxes still get a capped home
    (CI once failed 8 of 24 sessions with ENOENT on the template's temporary file)."""
    import tempfile

    from sandboxes import _disk

    for name in ("first", "second"):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / name))
        (tmp_path / name).mkdir()
        tpl = _disk._template(16)
        assert tpl.parent == tmp_path / name / "agentrl-disk-templates"
        assert tpl.stat().st_size == 16 << 20
    (tpl.parent / tpl.name).unlink()
    tpl.parent.rmdir()  # what a temp cleaner does
    assert _disk._template(16).exists()


async def test_disk_cap_falls_back_with_a_warning(
    make: MakeSandbox, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no capped filesystem can be made (no root, no loop devices), a sandbox runs
    without the cap and says so once; require_isolation refuses instead."""
    from sandboxes import _disk
    from sandboxes.local import LocalSandbox

    monkeypatch.setattr(_disk, "unavailable", lambda: "no loop devices in this test")
    _disk._warned.clear()
    with caplog.at_level(logging.WARNING, logger="sandboxes._disk"):
        sb = await make(disk_mb=64)
    assert "disk_mb=64 is off: no loop devices in this test" in caplog.text
    assert isinstance(sb, LocalSandbox) and sb.disk_mb == 0
    assert not os.path.ismount(sb.home)
    assert (await sb.exec("echo ok", timeout_s=10)).stdout == "ok\n"
    with pytest.raises(SandboxError, match="disk_mb=64: no loop devices in this test"):
        await make(disk_mb=64, require_isolation=True)
    assert await make(disk_mb=0)  # asked for no cap: no warning
    assert caplog.text.count("is off") == 1


@pytest.mark.skipif(disk_cap_ready() is not None, reason=str(disk_cap_ready()))
async def test_a_forked_child_never_mounts_its_parents_spare(make: MakeSandbox) -> None:
    """A spare filesystem belongs to the process that made it: a fork (multiprocessing's
    default start method) forgets them, so two processes never mount the same one."""
    from sandboxes import _disk

    await make(disk_mb=32)
    for _ in range(200):  # the spare is made in the background
        if _disk._spares.get(32):
            break
        await asyncio.sleep(0.01)
    assert _disk._spares.get(32), "no spare was made"
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not _disk._spares and not _disk._worker else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert _disk._spares.get(32)  # the parent keeps its own


KILLED_WITH_SPARE = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from agentrl.sandbox import make_sandbox, new_name
    from sandboxes import _disk
    async def main():
        sb = await make_sandbox("local", name=new_name(sys.argv[1]), root_dir=sys.argv[2],
                                disk_mb=16)
        for _ in range(500):  # the spare is made in the background
            if _disk._spares.get(16):
                break
            await asyncio.sleep(0.01)
        print("spare", _disk._spares[16][0].img, flush=True)
        os._exit(0)  # killed: no atexit, no close
    asyncio.run(main())
    """
)


@pytest.mark.skipif(disk_cap_ready() is not None, reason=str(disk_cap_ready()))
async def test_a_killed_process_leaves_no_spare_mounted(sandbox_root: str) -> None:
    """A spare is a detached mount held by a descriptor: when its process dies, the kernel
    unmounts it and frees its loop device; a sweep deletes the image it left."""
    from sandboxes import _disk
    from sandboxes.local import LocalSandbox

    prefix = f"agentrl-kspare{os.getpid()}-"
    try:
        out = subprocess.run(
            [sys.executable, "-c", KILLED_WITH_SPARE, prefix, sandbox_root],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "spare" in out.stdout, out.stderr
        img = Path(out.stdout.split()[1])
        for _ in range(100):  # the last descriptor's close releases the device
            if (
                str(img)
                not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
            ):
                break
            await asyncio.sleep(0.02)
        assert (
            str(img) not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        )
        assert img.exists()  # and it was never mounted anywhere but detached
        assert img.stem not in Path("/proc/mounts").read_text()
    finally:
        await sweep("local", prefix, LocalSandbox.Config(root_dir=sandbox_root))
    assert not img.exists() and img.parent == _disk.template_dir()


def test_settle_waits_for_the_disk_caps_background_work() -> None:
    """``settle`` returns only once the queued background work (spares, deletes of removed
    images) has run, and says False when its timeout comes first."""
    import threading

    from sandboxes import _disk

    release, ran = threading.Event(), []
    _disk._background(release.wait, 30)
    _disk._background(ran.append, 1)
    _disk._background(ran.append, 2)
    assert _disk.settle(0.05) is False  # the first job still holds a thread
    release.set()
    assert _disk.settle(30) is True
    assert sorted(ran) == [1, 2] and not _disk._pending
