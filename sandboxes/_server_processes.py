"""Long-lived processes in served sandboxes (a bash session): start, write, read, kill.

    POST /sandboxes/{id}/processes {argv, cwd, env} -> {pid}
    POST /sandboxes/{id}/processes/{pid}/write {data_b64} | read {offset, n, wait_s} -> {data_b64,
         eof, alive} | interrupt | kill

Output is pumped into a per-process buffer and read by stream offset, so a long-poll read the
client abandoned, or retried, loses and duplicates nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from pydantic import BaseModel

from agentrl.http import ApiError
from agentrl.sandbox import SandboxProcess

if TYPE_CHECKING:
    from sandboxes.server import Entry, SandboxServer

logger = logging.getLogger(__name__)


class ProcessRequest(BaseModel):
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None


class ProcessIO(BaseModel):
    data_b64: str = ""
    offset: int = 0
    """For read: the stream offset the client has consumed up to (a retried read re-gets data)."""
    n: int = 65536
    wait_s: float = 20.0


class PipedProcess:
    """A sandbox process whose output is pumped into a buffer read by offset.

    A long-poll read that the client gave up on (timeout, cancellation) loses nothing: the
    client's next read names the offset it really has, and the buffer keeps bytes from there.
    """

    def __init__(self, proc: SandboxProcess) -> None:
        self.proc = proc
        self._buf = bytearray()
        self._base = 0  # stream offset of _buf[0]
        self._eof = False
        self._more = asyncio.Event()
        self._pump = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while chunk := await self.proc.read():
                self._buf += chunk
                self._more.set()
        except Exception as e:
            logger.debug("process output pump stopped: %s", e)
        finally:
            self._eof = True
            self._more.set()

    async def read(self, offset: int, n: int, wait_s: float) -> tuple[bytes, bool]:
        """Bytes from ``offset`` on (at most ``n``), waiting up to ``wait_s``; (b"", True) at end."""
        if offset > self._base:  # the client has everything before offset: drop it
            drop = min(offset - self._base, len(self._buf))
            del self._buf[:drop]
            self._base += drop
        start = max(offset - self._base, 0)
        if len(self._buf) <= start and not self._eof:
            self._more.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), wait_s)
        data = bytes(self._buf[start : start + n])
        return data, not data and self._eof

    async def kill(self) -> None:
        await self.proc.kill()
        self._pump.cancel()


def process_routes(r: APIRouter, srv: SandboxServer) -> None:
    """Routes for long-lived processes: start, write, read (by offset), interrupt, kill."""

    def proc(e: Entry, pid: str) -> PipedProcess:
        p = e.procs.get(pid)
        if p is None:
            raise ApiError(404, "unknown_process", f"no process {pid!r} in {e.sandbox.name}")
        return p

    @r.post("/{sid}/processes")
    async def start(sid: str, req: ProcessRequest) -> dict[str, str]:
        async def run(e: Entry) -> str:
            pid = uuid.uuid4().hex[:12]
            p = await e.sandbox.start_process(req.argv, cwd=req.cwd, env=req.env)
            e.procs[pid] = PipedProcess(p)
            return pid

        return {"pid": await srv.use(sid, run)}

    @r.post("/{sid}/processes/{pid}/{op}")
    async def process_op(sid: str, pid: str, op: str, req: ProcessIO) -> dict[str, Any]:
        async def run(e: Entry) -> dict[str, Any]:
            piped = proc(e, pid)
            p = piped.proc
            if op == "write":
                await p.write(base64.b64decode(req.data_b64))
            elif op == "read":
                data, eof = await piped.read(req.offset, req.n, req.wait_s)
                return {"data_b64": base64.b64encode(data).decode(), "eof": eof, "alive": p.alive}
            elif op == "interrupt":
                await p.interrupt()
            elif op == "kill":
                await piped.kill()
                e.procs.pop(pid, None)
            else:
                raise ApiError(404, "unknown_operation", f"no process operation {op!r}")
            return {"alive": p.alive}

        try:
            return await srv.use(sid, run)
        except ApiError as err:
            if err.type == "sandbox_error" and op == "write":  # the process is gone
                raise ApiError(410, "broken_pipe", err.message) from err
            raise
