"""A real env pointed at a tool server by its kwargs, run by the ToolAgentLoop through the
rollout collector: each trajectory gets its own server session (and sandbox), closed after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import Env, register_env
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.tiny import build_tokenizer
from agentrl.toolserver.client import RemoteToolSet
from agentrl.toolserver.server import ToolServer
from agentrl.types import Message, RolloutStatus, Sample, user
from tests.toolserver import toolsets
from tests.toolserver.conftest import TOKEN, serve

_REMOTE: dict[str, RemoteToolSet] = {}


class RemoteShellEnv(Env):
    """Asks for a file to be written and read back; its tools live on a tool server."""

    def __init__(self, *, tool_server: str, token: str = "") -> None:
        if tool_server not in _REMOTE:
            _REMOTE[tool_server] = RemoteToolSet(RemoteToolSet.Config(url=tool_server, token=token))
        self.tools = _REMOTE[tool_server]

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return [user("Append 'hi' to mine.txt, show it, then say done.")], {}

    async def astep(self, action: Message) -> Any:
        return [], float("done" in action.text), True, False, {}

    async def aclose(self) -> None:
        assert isinstance(self.tools, RemoteToolSet)
        await self.tools.release(self)


register_env("test-toolserver/RemoteShell-v0", RemoteShellEnv)

WRITE = '<tool_call>{"name": "shell", "arguments": {"command": "echo hi >> mine.txt"}}</tool_call>'
READ = '<tool_call>{"name": "shell", "arguments": {"command": "cat mine.txt"}}</tool_call>'


@pytest.fixture
def server(needs_local: None, sandbox_root: str) -> Iterator[tuple[ToolServer, str]]:
    from sandboxes.local import LocalSandbox

    srv, thread = serve(toolsets.sandbox_toolset(), LocalSandbox.Config(root_dir=sandbox_root))
    yield srv, thread.url
    thread.stop()
    assert list(Path(sandbox_root).iterdir()) == []


async def test_tool_agent_loop_over_a_tool_server(server: tuple[ToolServer, str]) -> None:
    srv, url = server
    template = ChatTemplate(build_tokenizer())
    gen = ScriptedGenerator(template, [WRITE, READ, "done"])
    sample = Sample(
        env_id="test-toolserver/RemoteShell-v0", env_kwargs={"tool_server": url, "token": TOKEN}
    )
    config = CollectorConfig(group_size=3, agent="tool_calling", check_ledger=True)
    [group] = await RolloutCollector(config, gen, template).collect([sample])
    for traj in group.trajectories:
        assert traj.status is RolloutStatus.COMPLETED, traj.error
        assert traj.reward == 1.0
        tool_out = [m.content for m in traj.messages if m.role == "tool"]
        assert tool_out == ["", "hi\n"]  # its own sandbox: the group's writes do not mix
        assert traj.metrics["tool_calls"] == 2.0 and traj.metrics["tool_errors"] == 0.0
    assert srv.sessions == {}  # env.aclose released every session
    assert srv.metrics()["sessions_opened"] == 3 and srv.metrics()["tools"]["shell"]["calls"] == 6
    await _REMOTE.pop(url).aclose()
