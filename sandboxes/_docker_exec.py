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
    exec_id = api.exec_create(container_id, argv, stdin=True, user=user, workdir=workdir,
                              environment=env)["Id"]  # fmt: skip
    started.set_result(exec_id)
    sock = raw_socket(api.exec_start(exec_id, socket=True))
    try:
        if isinstance(stdin, bytes):
            sock.sendall(stdin)
        elif stdin is not None:
            while chunk := stdin.read(1 << 16):
                sock.sendall(chunk)
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


def kill_exec_tree(api: Any, exec_id: str, *, keep_root: bool = False) -> None:
    """SIGKILL the exec's process and its descendants on the host (the daemon is local)."""
    try:
        pid = api.exec_inspect(exec_id).get("Pid") or 0
        if pid <= 0:
            return
        root = psutil.Process(pid)
        victims = root.children(recursive=True) + ([] if keep_root else [root])
    except Exception:  # the exec is gone already
        return
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()


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
        await in_thread(kill_exec_tree, self._api, self._exec_id, keep_root=True)

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
