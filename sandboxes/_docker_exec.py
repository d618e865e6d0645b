"""Docker exec over the Engine API's hijacked socket: stdin in, multiplexed stdout/stderr out.

One exec is one blocking exchange, run in a worker thread::

    exec_create(stdin=True) -> exec_start(socket=True) -> send stdin, half-close
      -> read 8-byte-header frames (1 = stdout, 2 = stderr) until EOF -> exec_inspect(ExitCode)

The Docker SDK is synchronous; the async side awaits the thread and, on a timeout or a
cancellation, kills the exec's process tree on the host (its ``Pid`` from ``exec_inspect``)
so the thread's read ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from typing import IO, Any

import psutil

from agentrl.sandbox import OutputCap, SandboxProcess

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="agentrl-docker")

# Inside the container, every long-lived process (a session) runs under this reaper: a
# child subreaper (PR_SET_CHILD_SUBREAPER), so what its command leaves behind (double forks,
# `setsid`, `env -i`) is re-parented to it, not to the container's init; when the command
# exits it SIGKILLs whatever is left, round after round, then exits with the command's status.
# Images without python3 run the command bare (the host-side clean-up still applies).
_REAPER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        os.write(2, ("%s: %s\n" % (sys.argv[1], e.strerror)).encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: os.kill(pid, n))
code = 1
while True:
    try:
        p, status = os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if p == pid:
        code = os.waitstatus_to_exitcode(status)
        break
me = os.getpid()
for _ in range(1000):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d, "rb") as f:
                    st = f.read()
            except OSError:
                continue
            if int(st[st.rindex(b")") + 2:].split()[1]) == me:
                kids.append(int(d))
    if not kids:
        break
    for k in kids:
        try:
            os.kill(k, signal.SIGKILL)
        except OSError:
            pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
sys.exit(128 - code if code < 0 else code)
"""
_WITH_REAPER = (
    "if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "
    '\'import os; exec(os.environ.pop("AGENTRL_REAPER"))\' "$@"; fi; '
    'unset AGENTRL_REAPER; exec "$@"'
)
REAPER_ENV = {"AGENTRL_REAPER": _REAPER}
"""Goes into the exec's environment (the reaper removes it before running the command)."""


def reaped(argv: list[str]) -> list[str]:
    """``argv`` run under the subreaper (see ``_REAPER``) inside the container; the exec's
    environment must hold ``REAPER_ENV``."""
    return ["/bin/sh", "-c", _WITH_REAPER, "sh", *argv]


def raw_socket(sock: Any) -> socket.socket:
    return getattr(sock, "_sock", sock)  # the SDK wraps unix sockets in a SocketIO


@dataclass(slots=True)
class Frames:
    """Parses the multiplexed exec stream (used when stdin is attached without a tty)."""

    buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        out = []
        while len(self.buf) >= 8:
            stream, size = self.buf[0], struct.unpack(">I", self.buf[4:8])[0]
            if len(self.buf) < 8 + size:
                break
            out.append((stream, bytes(self.buf[8 : 8 + size])))
            del self.buf[: 8 + size]
        return out


@dataclass(slots=True)
class ExecOutcome:
    exit_code: int | None
    exec_id: str


def run_exec(
    api: Any,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    workdir: str,
    env: dict[str, str],
    stdin: bytes | IO[bytes] | None,
    out: OutputCap | IO[bytes],
    err: OutputCap,
    started: concurrent.futures.Future[str],
) -> ExecOutcome:
    """The blocking exchange. ``started`` receives the exec id as soon as it exists."""
    exec_id = api.exec_create(
        container_id, argv, stdin=True, user=user, workdir=workdir, environment=env
    )["Id"]
    started.set_result(exec_id)
    sock = raw_socket(api.exec_start(exec_id, socket=True))
    try:
        try:
            if isinstance(stdin, bytes):
                sock.sendall(stdin)
            elif stdin is not None:
                while chunk := stdin.read(1 << 16):
                    sock.sendall(chunk)
        except OSError:
            pass  # the command stopped reading (e.g. its write failed): its output still counts
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        frames = Frames()
        while data := sock.recv(1 << 16):
            for stream, payload in frames.feed(data):
                target = err if stream == 2 else out
                if isinstance(target, OutputCap):
                    target.feed(payload)
                else:
                    target.write(payload)
    except OSError:
        pass  # the socket was closed under us (timeout / cancellation)
    finally:
        sock.close()
    return ExecOutcome(exit_code=api.exec_inspect(exec_id).get("ExitCode"), exec_id=exec_id)


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, lambda: fn(*args, **kwargs))


def kill_exec_tree(api: Any, exec_id: str, *, keep_main: bool = False, rounds: int = 20) -> None:
    """SIGKILL the exec's process and its descendants on the host (the daemon is local).

    ``keep_main``: keep the exec's reaper and its command (the oldest child: the shell of a
    session), kill everything else under them. Repeats while new descendants appear (a fork
    bomb forks between a listing and the kills), at most ``rounds`` times."""
    try:
        info = api.exec_inspect(exec_id)
        pid = info.get("Pid") or 0
        if pid <= 0 or not in_container(pid, info.get("ContainerID", "")):
            return  # gone, or the daemon is on another machine
        root = psutil.Process(pid)
        under_reaper = root.cmdline()[1:4] == ["-I", "-S", "-c"]
    except Exception:  # the exec is gone already
        return
    for _ in range(rounds):
        try:
            kids = root.children()
            keep = {root.pid}
            if keep_main and under_reaper and kids:
                keep.add(min(kids, key=_started).pid)
            victims = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        victims = [p for p in victims if p.pid not in keep]
        if not victims:
            return
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _started(p: psutil.Process) -> float:
    try:
        return float(p.create_time())
    except psutil.Error:
        return float("inf")


def in_container(pid: int, container_id: str) -> bool:
    """Whether host pid ``pid`` is a process of that container (not the case, or a random
    process, when the daemon runs on another machine)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return bool(container_id) and container_id in f.read()
    except OSError:
        return False


def kill_orphans(init_pid: int, keep: set[int], container_id: str, rounds: int = 20) -> int:
    """SIGKILL children of the container's init other than ``keep`` (its main process), and
    their descendants: sessions run under a reaper, so these are what execs left behind (or
    what a session left after a command killed its reaper)."""
    n = 0
    if not in_container(init_pid, container_id):
        return 0
    for _ in range(rounds):  # again while an orphan's children fork between listing and kill
        try:
            orphans = [p for p in psutil.Process(init_pid).children() if p.pid not in keep]
        except psutil.Error:
            return n
        if not orphans:
            return n
        for p in orphans:
            for q in [*_safe_children(p), p]:
                with contextlib.suppress(psutil.Error):
                    q.kill()
                    n += 1
    return n


def _safe_children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return list(p.children(recursive=True))
    except psutil.Error:
        return []


class DockerProcess(SandboxProcess):
    """A long-lived exec with stdin attached; stdout and stderr come back interleaved."""

    def __init__(self, api: Any, exec_id: str, sock: socket.socket) -> None:
        self._api = api
        self._exec_id = exec_id
        self._sock = sock
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()  # b"" marks the end
        self._rest = b""
        self._eof = False
        self._killed = False
        self._pump = asyncio.get_running_loop().create_task(self._receive())

    async def _receive(self) -> None:
        """One reader for the socket's whole life, so a cancelled read() loses no data."""
        frames = Frames()
        try:
            while data := await in_thread(self._sock.recv, 1 << 16):
                for _, payload in frames.feed(data):
                    self._chunks.put_nowait(payload)
        except OSError:
            pass
        finally:
            self._chunks.put_nowait(b"")

    @property
    def alive(self) -> bool:
        return not (self._killed or self._eof)

    async def write(self, data: bytes) -> None:
        if not self.alive:
            raise BrokenPipeError("the sandbox process has exited")
        await in_thread(self._sock.sendall, data)

    async def read(self, n: int = 65536) -> bytes:
        if not self._rest and not self._eof:
            self._rest = await self._chunks.get()
            self._eof = not self._rest
        chunk, self._rest = self._rest[:n], self._rest[n:]
        return chunk

    async def interrupt(self) -> None:
        await in_thread(kill_exec_tree, self._api, self._exec_id, keep_main=True)

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        await in_thread(kill_exec_tree, self._api, self._exec_id)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            async with asyncio.timeout(5.0):
                await self._pump
        with contextlib.suppress(OSError):
            self._sock.close()
