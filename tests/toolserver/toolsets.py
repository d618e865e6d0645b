"""Tool sets the tool-server tests serve (importable by a server subprocess, too)."""

from __future__ import annotations

import asyncio

from agentrl.sandbox import Sandbox
from agentrl.tool import ToolSet, tool

RUNS: dict[str, int] = {}
"""How many times each ``count`` key really ran (in the process serving the tools)."""


@tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Anything.
    """
    return text


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


@tool
def boom(message: str) -> str:
    """Raise an error with the message.

    Args:
        message: What the error says.
    """
    raise ValueError(message)


@tool
async def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "woke up"


@tool
async def count(key: str, delay: float = 0.0) -> int:
    """Count a run under ``key`` and return the total.

    Args:
        key: Counter name.
        delay: Seconds to wait before answering.
    """
    RUNS[key] = RUNS.get(key, 0) + 1
    await asyncio.sleep(delay)
    return RUNS[key]


@tool(inject=("sandbox",))
async def write(path: str, text: str, sandbox: Sandbox) -> str:
    """Write a file in the sandbox.

    Args:
        path: File path.
        text: Contents.
    """
    await sandbox.write_file(path, text)
    return f"wrote {path}"


@tool(inject=("sandbox",))
async def shell(command: str, sandbox: Sandbox) -> str:
    """Run a shell command in the sandbox.

    Args:
        command: The command.
    """
    r = await sandbox.exec(command, timeout_s=20)
    return r.output + ("" if r.ok else f"[exit code {r.exit_code}]")


def basic_toolset() -> ToolSet:
    return ToolSet([echo, add, boom, slow, count], name="basic")


def sandbox_toolset() -> ToolSet:
    return ToolSet([echo, write, shell], name="sandboxed")
