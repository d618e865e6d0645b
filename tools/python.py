"""Run a Python snippet in the sandbox (``python3 -``, the code on stdin, a fresh process)."""

from __future__ import annotations

from agentrl.sandbox import Sandbox
from agentrl.tool import tool
from tools._state import clip

MAX_TIMEOUT_S = 600.0


@tool(inject=("sandbox",))
async def python(code: str, sandbox: Sandbox, timeout: float = 60.0) -> str:
    """Run Python 3 code in a fresh interpreter in the workspace; returns what it printed.

    Args:
        code: The program, e.g. "import sys; print(sys.version)". Print what you want to see.
        timeout: Seconds before the program is killed (at most 600).
    """
    timeout = min(max(float(timeout), 1.0), MAX_TIMEOUT_S)
    r = await sandbox.exec(["python3", "-"], stdin=code, timeout_s=timeout)
    parts = [clip(r.output)]
    if r.timed_out:
        parts.append(f"[timed out after {timeout:g}s; the program was killed]")
    elif r.oom_killed:
        parts.append("[killed: the sandbox's memory limit was exceeded]")
    elif r.exit_code != 0:
        parts.append(f"[exit code {r.exit_code}]")
    return "\n".join(p for p in parts if p) or "[no output]"
