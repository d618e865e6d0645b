"""The host side of a local sandbox's exec agent: start it, send it commands, read results.

    agent = await ExecAgent.start(chain, env, cg, leaf, token)  # the chain ends in agent_argv()
    reply = await agent.run(argv, cwd=..., env=..., timeout_s=5, caps=(64 << 10, 64 << 10))
    await agent.stop()                                    # then kill its leaf cgroup

A fresh ``sh -> prlimit -> setpriv -> bwrap`` chain costs ~30 ms per command, mostly exec'ing
and setting up namespaces. The agent (``_agent_inside.py``, run with the system's ``python3``)
pays that once per sandbox and then starts each command from a child it forked ahead of
time, in the command's own pid namespace (see that module). Requests and replies are frames on
the agent's stdin/stdout pipes; many requests may be in flight at once, told apart by id.
``AgentSlot`` keeps a sandbox's agent running (and restarts it) across the sandbox's life.

The agent is as unprivileged as the commands it runs, so its replies are checked like any input
from the sandbox: frame sizes are bounded, unknown ids are dropped, a malformed frame ends the
agent. If the agent dies, in-flight requests raise ``SandboxError`` and ``alive`` turns False
(the sandbox starts a new agent on its next command). Cancelling a ``run`` kills its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import signal
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agentrl.errors import SandboxError
from agentrl.sandbox import OutputCap
from sandboxes import _cgroup
from sandboxes._local_process import Command

logger = logging.getLogger(__name__)

HDR = struct.Struct(">II")
MAX_HEADER = 1 << 16
STREAM_CHUNK = 1 << 16  # the agent's read size
START_TIMEOUT_S = 30.0
REPLY_GRACE_S = 10.0  # how long past a command's timeout the agent may take to answer
MAX_STDIN = 1 << 20  # larger stdin goes through a fresh chain, streamed
_ERR_KEEP = 4096  # bytes of the agent's own stderr kept for error messages
SECCOMP_ENV = "AGENTRL_SECCOMP"  # the agent's env: the filter (hex) it installs per command


@functools.cache
def agent_argv() -> list[str]:
    """``python3 -I -S -c <source>``: the package is not visible inside the sandbox."""
    src = (Path(__file__).with_name("_agent_inside.py")).read_text()
    return ["python3", "-I", "-S", "-c", src]


@dataclass(frozen=True, slots=True)
class AgentReply:
    exit_code: int
    timed_out: bool
    stdout: OutputCap
    stderr: OutputCap
    error: str = ""  # set when the command could not be started (fork failed, ...)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[AgentReply]
    caps: tuple[int, int]
    stdout_file: IO[bytes] | None


class ExecAgent:
    """A running agent process and the requests in flight on it."""

    def __init__(self, cmd: Command, cg: _cgroup.SandboxCgroup | None) -> None:
        self.loop = asyncio.get_running_loop()  # its pipes and readers live in this loop
        self.cmd = cmd
        self.cg = cg
        self.leaf = cmd.leaf
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._err = bytearray()
        self._dead: str | None = None
        self._hello: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self._tasks: list[asyncio.Task[None]] = []
        self._max_payload = STREAM_CHUNK  # grows with the largest output caps asked for

    @classmethod
    async def start(
        cls,
        chain: list[str],
        env: dict[str, str],
        cg: _cgroup.SandboxCgroup | None,
        leaf: _cgroup.Leaf | None,
        token: str,
    ) -> ExecAgent:
        """Start the chain and wait for the agent's hello; ``SandboxError`` if it fails."""
        cmd = await Command.start(
            chain,
            env,
            leaf,
            token,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        agent = cls(cmd, cg)
        loop = asyncio.get_running_loop()
        agent._tasks = [loop.create_task(agent._read()), loop.create_task(agent._read_err())]
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                hello = await agent._hello
            if not hello.get("ok"):
                raise SandboxError(f"it cannot run commands here: {hello.get('error')}")
        except BaseException as e:
            if isinstance(e, SandboxError):  # it exited: let its last words arrive
                await asyncio.wait(agent._tasks[1:], timeout=1.0)
            await agent.stop()  # the caller removes the agent's leaf cgroup, and the agent with it
            if isinstance(e, TimeoutError | SandboxError):
                why = e if isinstance(e, SandboxError) else "no answer"
                raise SandboxError(
                    f"the exec agent did not start: {why}{agent._stderr_tail()}"
                ) from None
            raise
        return agent

    @property
    def alive(self) -> bool:
        return self._dead is None and self.cmd.proc.returncode is None

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        timeout_s: float,
        caps: tuple[int, int],
        rlimits: list[tuple[str, int]],
        stdin: bytes | None = None,
        stdout_file: IO[bytes] | None = None,
    ) -> AgentReply:
        """Run one command; its output goes to ``stdout_file`` instead of the cap if given."""
        if not self.alive:
            raise SandboxError(f"the exec agent is not running ({self._dead or 'exited'})")
        rid = next(self._ids)
        header = {
            "op": "run",
            "id": rid,
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "timeout": timeout_s,
            "caps": list(caps),
            "rlimits": rlimits,
            "stdin": stdin is not None,
            "stream_out": stdout_file is not None,
        }
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(fut, caps, stdout_file)
        self._max_payload = max(self._max_payload, sum(caps))
        try:
            self._send(header, stdin or b"")
            async with asyncio.timeout(timeout_s + REPLY_GRACE_S):
                return await asyncio.shield(fut)
        except TimeoutError:
            self._fail(f"no answer {timeout_s + REPLY_GRACE_S:.0f}s after a command started")
            raise SandboxError("the exec agent stopped answering; it was killed") from None
        finally:
            if self._pending.pop(rid, None) is not None and not fut.done():
                with contextlib.suppress(SandboxError):  # cancelled: stop the command too
                    self._send({"op": "kill", "id": rid})

    def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        stdin = self.cmd.proc.stdin
        if stdin is None or stdin.is_closing() or not self.alive:
            raise SandboxError(f"the exec agent is not running ({self._dead or 'exited'})")
        data = json.dumps(header).encode()
        stdin.write(HDR.pack(len(data), len(payload)) + data + payload)

    async def _read(self) -> None:
        """Read frames until the agent's stdout ends; then fail whatever is still pending."""
        out = self.cmd.proc.stdout
        why = "it exited"
        try:
            while out is not None:
                hlen, plen = HDR.unpack(await out.readexactly(HDR.size))
                if hlen > MAX_HEADER or plen > self._max_payload:
                    why = f"it sent a frame of {hlen}+{plen} bytes"
                    break
                header = json.loads(await out.readexactly(hlen))
                self._dispatch(header, await out.readexactly(plen))
        except asyncio.IncompleteReadError:
            pass
        except (ValueError, KeyError, TypeError, OSError) as e:
            why = f"it sent a malformed frame ({type(e).__name__}: {e})"
        if self._dead is None:  # it died on its own: its commands die before their execs return
            self._set_dead(why)
            with contextlib.suppress(Exception):
                await self.cmd.kill(self.cg)
        self._fail(why)

    def _dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        ev = header["ev"]
        if ev == "hello":
            if not self._hello.done():
                self._hello.set_result(header)
            return
        p = self._pending.get(int(header["id"]))
        if p is None or p.future.done():
            return  # cancelled meanwhile
        if ev == "out":
            if p.stdout_file is not None:
                p.stdout_file.write(payload)
            return
        if ev != "done":
            raise ValueError(f"unknown event {ev!r}")
        lens, totals = [int(x) for x in header["lens"]], [int(x) for x in header["totals"]]
        caps, pos = [], 0
        for i, limit in enumerate(p.caps):
            cap = OutputCap(limit)
            for n in lens[2 * i : 2 * i + 2]:
                cap.feed(payload[pos : pos + n])
                pos += n
            cap.total = max(totals[i], cap.total)
            caps.append(cap)
        p.future.set_result(
            AgentReply(
                exit_code=int(header["code"]),
                timed_out=bool(header["timed_out"]),
                stdout=caps[0],
                stderr=caps[1],
                error=str(header.get("error", "")),
            )
        )

    async def _read_err(self) -> None:
        err = self.cmd.proc.stderr
        while err is not None and (chunk := await err.read(65536)):
            self._err += chunk
            del self._err[: max(0, len(self._err) - _ERR_KEEP)]

    def _stderr_tail(self) -> str:
        text = self._err.decode(errors="replace").strip()
        return f"; its stderr: {text[-1000:]}" if text else ""

    def _set_dead(self, why: str) -> None:
        self._dead = why
        if why != "killed":
            logger.warning(
                "the exec agent (pid %s) died: %s%s", self.cmd.proc.pid, why, self._stderr_tail()
            )

    def _fail(self, why: str) -> None:
        """Mark the agent dead, SIGKILL its chain, and fail every pending request."""
        if self._dead is None:
            self._set_dead(why)
        self._sigkill()
        msg = f"the sandbox's exec agent died ({self._dead})"
        if not self._hello.done():
            self._hello.set_exception(SandboxError(msg))
            self._hello.exception()
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(SandboxError(msg))
                p.future.exception()

    def detach(self) -> None:
        """SIGKILL the agent's chain and stop listening, without waiting (the caller kills
        the agent's cgroup next, which takes the commands with it). In the agent's loop."""
        self._fail("killed")
        for t in self._tasks:
            t.cancel()
        self.cmd.close_pipes()

    def _sigkill(self) -> None:
        # not proc.kill(): its poll() may reap the process before asyncio's child watcher does
        if self.cmd.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.cmd.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Kill the agent's chain and stop listening; works from any loop or thread (a sandbox
        may be closed from another loop). The caller kills the agent's cgroup next."""
        if self._dead is None:
            self._dead = "killed"
        self._sigkill()
        if self.loop is _running_loop():
            with contextlib.suppress(TimeoutError):  # reaped first, then the pipes closed
                async with asyncio.timeout(2.0):
                    await self.cmd.exited.wait()
            self.detach()
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop has nothing left to stop
                self.loop.call_soon_threadsafe(self.detach)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AgentSlot:
    """A sandbox's agent over its life: started with the sandbox, started again after it dies
    (or when the sandbox is used from another event loop), given up (commands then use fresh
    chains) when it cannot start."""

    def __init__(
        self,
        name: str,
        start: Callable[[], Awaitable[ExecAgent]],
        cg: _cgroup.SandboxCgroup | None,
        *,
        enabled: bool,
    ) -> None:
        self.name = name
        self.enabled = enabled
        self.agent: ExecAgent | None = None
        self._start = start
        self._cg = cg
        self._locks: dict[int, asyncio.Lock] = {}  # per event loop
        self._closed = False
        self._warming: asyncio.Task[ExecAgent | None] | None = None

    def start_soon(self) -> None:
        """Start the agent in the background: the sandbox is usable at once, and a command
        that comes before the agent is up waits for it (a failed start falls back to fresh
        chains, as in ``get``)."""
        if self.enabled and not self._closed and self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(self.get())
            self._warming.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Task[ExecAgent | None]) -> None:
        if not task.cancelled() and (e := task.exception()) is not None:  # the next command retries
            logger.warning("sandbox %s: exec agent start failed: %r", self.name, e)

    def _usable(self, loop: asyncio.AbstractEventLoop) -> ExecAgent | None:
        agent = self.agent
        return agent if agent is not None and agent.alive and agent.loop is loop else None

    async def get(self) -> ExecAgent | None:
        """The running agent, started if needed; None: run commands through fresh chains."""
        loop = asyncio.get_running_loop()
        if (agent := self._usable(loop)) is not None:
            return agent
        async with self._locks.setdefault(id(loop), asyncio.Lock()):
            if (agent := self._usable(loop)) is not None:
                return agent
            if not self.enabled or self._closed:
                return None
            if self.agent is not None:  # died (killed, out of memory), or of another loop
                old, self.agent = self.agent, None
                await self._drop(old)
            try:
                agent = await self._start()
            except SandboxError as e:
                self.enabled = False
                logger.warning(
                    "sandbox %s: %s; each command starts a fresh chain instead "
                    "(slower, equally isolated)",
                    self.name,
                    e,
                )
                return None
            if self._closed:  # closed while it started
                await self._drop(agent)
                return None
            self.agent = agent
            return agent

    async def _drop(self, agent: ExecAgent) -> None:
        await agent.stop()
        if self._cg is not None and agent.leaf is not None:
            await _kill_now(agent.leaf)
            await self._cg.remove_leaf(agent.leaf)

    async def close(self) -> None:
        """Stop the agent and its commands; the caller removes the sandbox's cgroup next."""
        self._closed = True
        warming, self._warming = self._warming, None
        if warming is not None and not warming.done():
            # A start cut short removes its own leaf (LocalSandbox._start_agent). A sandbox may
            # be closed from another event loop (a server's thread made it): cancel there, and
            # let the cgroup's kill below take whatever that start had spawned.
            if warming.get_loop() is asyncio.get_running_loop():
                warming.cancel()
                await asyncio.wait([warming])
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nothing runs it
                    warming.get_loop().call_soon_threadsafe(warming.cancel)
        if self.agent is not None:
            await self.agent.stop()
            if self.agent.leaf is not None:  # kill its processes now, polling fast
                await _kill_now(self.agent.leaf)


async def _kill_now(leaf: _cgroup.Leaf, rounds: int = 50) -> None:
    """SIGKILL everything in ``leaf`` and wait (1 ms polls) until it is empty, so the sandbox
    cgroup's own kill (which polls every 10 ms) finds nothing left."""
    for _ in range(rounds):
        pids = _cgroup.pids_in(leaf.dirs)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.001)
