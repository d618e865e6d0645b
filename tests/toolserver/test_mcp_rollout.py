"""An MCP server's tools inside a rollout: ``python -m agentrl.mcp`` serves a small tool set over
stdio, ``mcp_toolset`` turns it back into a ToolSet, an env exposes it, and the ToolAgentLoop
run by the RolloutCollector (a ScriptedGenerator emitting Hermes tool calls) calls it. The tool
messages in each trajectory must hold what the MCP server process computed.

(Listing and calling agentrl's own tools from an MCP client is tested in test_toolserver_mcp.py.)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import Env, register_env
from agentrl.mcp import MCPToolSet, mcp_toolset
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.tiny import build_tokenizer
from agentrl.tool import ToolSet, tool
from agentrl.types import Message, RolloutStatus, Sample, user

pytest.importorskip("mcp")
ROOT = str(Path(__file__).resolve().parents[2])

_MCP: dict[str, MCPToolSet] = {}
"""Open MCP connections by name; the env finds its tools here (env kwargs stay plain data)."""


@tool
def server_pid() -> int:
    """The process id of the process running this tool."""
    return os.getpid()


def mcp_tools() -> ToolSet:
    """What the MCP server subprocess serves: the arithmetic calculator and ``server_pid``."""
    from envs.countdown import CALCULATOR_TOOLS

    return ToolSet([*CALCULATOR_TOOLS, server_pid], name="mcp-demo")


class McpCalcEnv(Env):
    """Asks for 37 * 48; its tools are an MCP server's. Reward 1 if the answer is 1776."""

    def __init__(self, *, mcp: str) -> None:
        self.tools = _MCP[mcp]

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return [user("Compute 37 * 48 with the calculator, then give the answer.")], {}

    async def astep(self, action: Message) -> Any:
        return [], float("1776" in action.text), True, False, {}


register_env("test-mcp/Calc-v0", McpCalcEnv)


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
async def mcp_calc() -> AsyncIterator[MCPToolSet]:
    cmd = [sys.executable, "-m", "agentrl.mcp", "tests.toolserver.test_mcp_rollout:mcp_tools"]
    async with await mcp_toolset(cmd, name="calc", cwd=ROOT, timeout_s=60) as tools:
        _MCP["calc"] = tools
        yield tools
    _MCP.pop("calc", None)


async def test_mcp_tools_in_a_tool_agent_rollout(mcp_calc: MCPToolSet) -> None:
    assert sorted(mcp_calc.names) == ["calculator", "server_pid"]
    template = ChatTemplate(build_tokenizer())
    script = [
        hermes("calculator", {"expression": "37 * 48"}),
        hermes("server_pid", {}),
        "The answer is 1776.",
    ]
    gen = ScriptedGenerator(template, script)
    config = CollectorConfig(group_size=2, agent="tool_calling", check_ledger=True)
    sample = Sample(env_id="test-mcp/Calc-v0", env_kwargs={"mcp": "calc"})
    [group] = await RolloutCollector(config, gen, template).collect([sample])

    assert len(group.trajectories) == 2
    for traj in group.trajectories:
        assert traj.status is RolloutStatus.COMPLETED, traj.error
        assert traj.reward == 1.0
        tool_msgs = [m for m in traj.messages if m.role == "tool"]
        assert tool_msgs[0].text == "1776"  # computed by the MCP server
        pid = int(tool_msgs[1].text)
        assert pid != os.getpid()  # ...in the server's own process, not this one
        assert traj.metrics["tool_calls"] == 2.0 and traj.metrics["tool_errors"] == 0.0
        # the token ledger holds the MCP tools' schemas (the prompt) and the tool's result
        [segment] = traj.segments
        text = template.decode(segment.token_ids)
        assert '"calculator"' in text and '"server_pid"' in text and "1776" in text


async def test_mcp_tool_error_reaches_the_model(mcp_calc: MCPToolSet) -> None:
    template = ChatTemplate(build_tokenizer())
    gen = ScriptedGenerator(template, [hermes("calculator", {"expression": "1 / 0"}), "no idea"])
    config = CollectorConfig(group_size=1, agent="tool_calling", check_ledger=True)
    sample = Sample(env_id="test-mcp/Calc-v0", env_kwargs={"mcp": "calc"})
    [group] = await RolloutCollector(config, gen, template).collect([sample])
    [traj] = group.trajectories
    assert traj.status is RolloutStatus.COMPLETED, traj.error
    assert traj.reward == 0.0
    [tool_msg] = [m for m in traj.messages if m.role == "tool"]
    assert "division" in tool_msg.text.lower() or "zero" in tool_msg.text.lower()
    assert traj.metrics["tool_errors"] == 1.0
