"""MCP both ways: our tool sets served over MCP stdio (``python -m agentrl.mcp``) and consumed
back with ``mcp_toolset``; calls, errors and sandboxed tools round-trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, SandboxError
from agentrl.mcp import mcp_toolset
from agentrl.types import ToolCall

pytest.importorskip("mcp")
ROOT = str(Path(__file__).resolve().parents[2])


def serve_cmd(factory: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.mcp", factory, *extra]


async def test_round_trip_over_stdio() -> None:
    async with await mcp_toolset(
        serve_cmd("tests.toolserver.toolsets:basic_toolset"), cwd=ROOT, timeout_s=60
    ) as tools:
        assert tools.names == ["echo", "add", "boom", "slow", "count"]
        [add] = [s for s in tools.schemas() if s["function"]["name"] == "add"]
        assert add["function"]["parameters"]["required"] == ["a", "b"]
        assert add["function"]["description"] == "Add two integers."
        res = await tools.call(ToolCall(name="add", arguments={"a": 40, "b": 2}))
        assert (res.content, res.is_error) == ("42", False)
        res = await tools.call(ToolCall(name="boom", arguments={"message": "kaput"}))
        assert res.is_error and "kaput" in res.content
        res = await tools.call(ToolCall(name="add", arguments={"a": "x", "b": 1}))
        assert res.is_error
        res = await tools.call(ToolCall(name="nope", arguments={}))
        assert res.is_error and "no tool named 'nope'" in res.content
        # the served tools ran in the server process, not here
        from tests.toolserver import toolsets

        assert (await tools.call(ToolCall(name="count", arguments={"key": "mcp"}))).content == "1"
        assert "mcp" not in toolsets.RUNS
    with pytest.raises(SandboxError, match="closed"):
        await tools.call(ToolCall(name="echo", arguments={"text": "after close"}))


async def test_sandboxed_tools_over_mcp(needs_local: None) -> None:
    async with await mcp_toolset(
        serve_cmd("tests.toolserver.toolsets:sandbox_toolset"), cwd=ROOT, timeout_s=60
    ) as tools:
        await tools.call(ToolCall(name="write", arguments={"path": "f.txt", "text": "via mcp"}))
        res = await tools.call(ToolCall(name="shell", arguments={"command": "cat f.txt; pwd"}))
        assert res.content == "via mcp/workspace\n"


async def test_bad_targets_fail_clearly() -> None:
    with pytest.raises(ConfigError, match="http"):
        await mcp_toolset("not-a-url")
    with pytest.raises(SandboxError, match="could not connect"):
        await mcp_toolset([sys.executable, "-c", "import sys; sys.exit(3)"])


async def test_silent_server_times_out() -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(SandboxError, match="did not answer"):
        await mcp_toolset(silent, connect_timeout_s=1)
