"""A persistent bash session per sandbox: ``cd`` and exported variables last between calls.

Protocol (over the shell's stdin/stdout, stderr merged): each command is sent base64-encoded
and run with ``eval`` in the shell itself, stdin from /dev/null and stderr into stdout (so
the two interleave as written, on every backend), followed by a sentinel line
that carries a per-call random nonce and the exit status::

    eval "$(printf %s <b64> | base64 -d)" </dev/null 2>&1; printf '\\n__AGENTRL_DONE_<nonce>__%s\\n' "$?"

Output is read until the sentinel. Encoding the command means a quoting mistake cannot leave
the shell waiting for a closing quote, and a command cannot eat the next one from stdin. On a
timeout the session kills everything the shell started (``SandboxProcess.interrupt``) and
waits briefly for the sentinel; if the shell itself is stuck (a shell-builtin loop) it is
restarted and the model is told that its cwd and variables were reset.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import re
import uuid
import weakref
from dataclasses import dataclass

from agentrl.errors import SandboxError
from agentrl.sandbox import OutputCap, Sandbox, SandboxProcess
from agentrl.tool import tool
from tools._state import MAX_OUTPUT_CHARS, clip, state_of

MAX_TIMEOUT_S = 600.0
INTERRUPT_GRACE_S = 3.0
PIDS_WATCH_S = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class BashOutput:
    output: str
    exit_code: int | None  # None when the command did not finish
    timed_out: bool = False
    restarted: bool = False  # the shell was replaced: cwd and variables are back to defaults
    note: str = ""  # what the session did on its own (e.g. recovered from the pids limit)


class BashSession:
    """One long-lived ``bash`` in a sandbox."""

    def __init__(self, sandbox: Sandbox, *, max_output_bytes: int = 4 * MAX_OUTPUT_CHARS) -> None:
        # weak: the session lives in the per-sandbox state map (a WeakKeyDictionary), and a
        # strong reference back to its key would keep every sandbox alive after close
        self._sandbox = weakref.ref(sandbox)
        self.max_output_bytes = max_output_bytes
        self._proc: SandboxProcess | None = None
        self._lock = asyncio.Lock()
        self._had_shell = False  # a shell ran before: a new one is a restart

    @property
    def sandbox(self) -> Sandbox:
        sb = self._sandbox()
        if sb is None:
            raise SandboxError("the sandbox of this bash session no longer exists")
        return sb

    async def _ensure(self) -> bool:
        """Start the shell if needed; True if a new one was started."""
        if self._proc is not None and self._proc.alive:
            return False
        self._proc = await self.sandbox.start_process(
            ["/bin/bash", "--noprofile", "--norc"], cwd=self.sandbox.workdir
        )
        return True

    async def run(self, command: str, timeout_s: float = 120.0) -> BashOutput:
        async with self._lock:
            pre = await self.sandbox.pids_in_use()
            before = await self._recover_pids(pre)  # earlier leftovers filled the sandbox
            if before:
                pre = await self.sandbox.pids_in_use()
            out = await self._run(command, timeout_s)
            usage = await self._settled_pids(pre)
            after = await self._recover_pids(usage, forks_failed=_FORK_FAILED in out.output)
            note = "\n".join(n for n in (before, after) if n)
            return dataclasses.replace(out, note=note) if note else out

    async def _settled_pids(self, pre: tuple[int, int] | None) -> tuple[int, int] | None:
        """The sandbox's pids after a call: if the call left processes and their number still
        grows (a fork bomb fills 256 pids in ~0.35 s), watch until it stops or nears the
        limit (50 ms polls, 2 s at most); a steady background job costs one poll."""
        usage = await self.sandbox.pids_in_use()
        if usage is None or pre is None:
            return usage
        deadline = asyncio.get_running_loop().time() + PIDS_WATCH_S
        while usage[0] > pre[0] and not _near_limit(usage):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
            now = await self.sandbox.pids_in_use()
            if now is None or now[0] <= usage[0]:
                break
            usage = now
        return usage

    async def _recover_pids(
        self, usage: tuple[int, int] | None, *, forks_failed: bool = False
    ) -> str:
        """If the sandbox is (nearly) out of pids, or the shell's forks failed for want of them
        (a bomb churning below the limit between samples), kill this session's processes and
        its shell (the next command starts a new one) and say so; "" when nothing was wrong."""
        if self._proc is None or usage is None or not (forks_failed or _near_limit(usage)):
            return ""
        await self.close()
        left = ""
        if _near_limit(await self.sandbox.pids_in_use()):
            left = "; the sandbox is still at its limit: other commands hold the processes"
        return (
            f"[the sandbox reached its process limit (pids_max={usage[1]}, {usage[0]} in "
            "use: a fork bomb or runaway background jobs); every process of this shell was "
            f"killed and the shell was restarted: working directory and variables were "
            f"reset{left}]"
        )

    async def _run(self, command: str, timeout_s: float) -> BashOutput:
        nonce = uuid.uuid4().hex
        b64 = base64.b64encode(command.encode()).decode()
        line = (
            f'eval "$(printf %s {b64} | base64 -d)" </dev/null 2>&1; '
            f"printf '\\n__AGENTRL_DONE_{nonce}__%s\\n' \"$?\"\n"
        )
        restarted = await self._send(line.encode())
        assert self._proc is not None
        reader = _SentinelReader(self._proc, nonce, self.max_output_bytes)
        try:
            async with asyncio.timeout(timeout_s):
                code = await reader.read_until_sentinel()
        except TimeoutError:
            return await self._recover(reader, restarted)
        except asyncio.CancelledError:  # the command may still run: never reuse this shell
            await asyncio.shield(self.close())
            raise
        if code is None:  # the shell exited (e.g. `exit`); the next call starts a new one
            await self._kill()
        return BashOutput(output=reader.text(), exit_code=code, restarted=restarted)

    async def _send(self, line: bytes) -> bool:
        """Write ``line`` to the shell, (re)starting it if needed; True if it was restarted."""
        for attempt in range(2):
            restarted = await self._ensure() and self._had_shell
            self._had_shell = True
            assert self._proc is not None
            try:
                await self._proc.write(line)
                return restarted
            except (BrokenPipeError, ConnectionResetError) as e:
                await self._kill()
                if attempt:
                    raise SandboxError(f"the bash session in {self.sandbox.name} died: {e}") from e
        return True

    async def _kill(self) -> None:
        if self._proc is not None:
            await self._proc.kill()
            self._proc = None

    async def close(self) -> None:
        """Stop the shell; the next command starts a new one without announcing a restart."""
        await self._kill()
        self._had_shell = False

    async def _recover(self, reader: _SentinelReader, restarted: bool) -> BashOutput:
        """After a timeout: interrupt, and restart the shell if it does not come back."""
        assert self._proc is not None
        await self._proc.interrupt()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(INTERRUPT_GRACE_S):
                await reader.read_until_sentinel()
                return BashOutput(
                    output=reader.text(), exit_code=None, timed_out=True, restarted=restarted
                )
        await self.close()
        return BashOutput(output=reader.text(), exit_code=None, timed_out=True, restarted=True)


_FORK_FAILED = "fork: retry: Resource temporarily unavailable"
"""What bash prints when a fork fails with EAGAIN (the pids limit)."""


def _near_limit(usage: tuple[int, int] | None) -> bool:
    return usage is not None and usage[0] >= usage[1] - max(2, usage[1] // 32)


class _SentinelReader:
    def __init__(self, proc: SandboxProcess, nonce: str, cap: int) -> None:
        self._proc = proc
        self._pattern = re.compile(rb"\n__AGENTRL_DONE_" + nonce.encode() + rb"__(\d+)\n")
        self._keep = len(nonce) + 40
        self._pending = b""
        self._cap = OutputCap(cap)

    async def read_until_sentinel(self) -> int | None:
        """The command's exit code, or None if the shell exited first."""
        while True:
            chunk = await self._proc.read()
            if not chunk:
                self._cap.feed(self._pending)
                self._pending = b""
                return None
            self._pending += chunk
            m = self._pattern.search(self._pending)
            if m:
                self._cap.feed(self._pending[: m.start()])
                self._pending = b""
                return int(m.group(1))
            if len(self._pending) > self._keep:
                self._cap.feed(self._pending[: -self._keep])
                self._pending = self._pending[-self._keep :]

    def text(self) -> str:
        return self._cap.text() + self._pending.decode("utf-8", "replace")


async def session_for(sandbox: Sandbox) -> BashSession:
    st = state_of(sandbox)
    if st.bash is None:
        st.bash = BashSession(sandbox)
    return st.bash


def format_bash(out: BashOutput, timeout_s: float) -> str:
    parts = [clip(out.output)]
    if out.timed_out:
        parts.append(
            f"[command timed out after {timeout_s:g}s; it and everything it started were killed]"
        )
    elif out.exit_code is None:
        parts.append("[the shell exited]")
    elif out.exit_code != 0:
        parts.append(f"[exit code {out.exit_code}]")
    if out.restarted:
        parts.append("[the shell was restarted: working directory and variables were reset]")
    if out.note:
        parts.append(out.note)
    return "\n".join(p for p in parts if p) or "[no output]"


@tool(inject=("sandbox",))
async def bash(
    command: str, sandbox: Sandbox, timeout: float = 120.0, restart: bool = False
) -> str:
    """Run a command in a persistent bash shell (cd and exported variables persist).

    Args:
        command: The bash command to run, e.g. "cd src && grep -rn TODO . | head".
        timeout: Seconds before the command is killed (at most 600).
        restart: Kill the shell and start a fresh one before running the command.
    """
    session = await session_for(sandbox)
    if restart:
        await session.close()
    timeout = min(max(float(timeout), 1.0), MAX_TIMEOUT_S)
    return format_bash(await session.run(command, timeout_s=timeout), timeout)
