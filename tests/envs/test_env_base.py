"""The Env base: sync/async twins, seeding through super(), spaces, tool execution."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.env import Env
from agentrl.spaces import MessagesSpace
from agentrl.tool import ToolSet, tool
from agentrl.types import Message, ToolCall


class SyncEnv(Env):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return [Message(role="user", content=str(self.np_random.integers(1000)))], {}

    def step(self, action: Message):
        return [Message(role="user", content=action.text.upper())], 1.0, True, False, {}


class AsyncEnv(Env):
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        return [Message(role="user", content=str(self.np_random.integers(1000)))], {}

    async def astep(self, action: Message):
        return [Message(role="user", content=action.text.upper())], 1.0, True, False, {}


@pytest.mark.parametrize("cls", [SyncEnv, AsyncEnv])
async def test_twins_and_seeding_work_for_sync_and_async_envs(cls: type[Env]) -> None:
    env = cls()
    a, _ = await env.areset(seed=3)
    b, _ = await env.areset(seed=3)
    c, _ = await env.areset(seed=4)
    assert a == b and a != c
    obs, reward, terminated, _, _ = await env.astep(Message(role="assistant", content="hi"))
    assert (obs[0].content, reward, terminated) == ("HI", 1.0, True)


@pytest.mark.parametrize("cls", [SyncEnv, AsyncEnv])
def test_sync_api_for_sync_and_async_envs(cls: type[Env]) -> None:
    env = cls()
    assert env.reset(seed=3) == env.reset(seed=3)
    assert env.step(Message(role="assistant", content="x"))[0][0].content == "X"


def test_an_env_implementing_nothing_says_so() -> None:
    class Empty(Env):
        pass

    with pytest.raises(NotImplementedError, match="must implement reset"):
        Empty().reset(seed=0)
    with pytest.raises(NotImplementedError, match="must implement step"):
        Empty().step(Message(role="assistant"))


@tool
def echo(text: str) -> str:
    """Echo text."""
    return text


class ToolEnv(SyncEnv):
    tools = ToolSet([echo])


async def test_default_spaces_and_tool_calls() -> None:
    env = ToolEnv()
    assert isinstance(env.observation_space, MessagesSpace)
    assert env.action_space == MessagesSpace.actions(tool_names=("echo",))
    env.action_space.seed(0)
    samples = [env.action_space.sample() for _ in range(20)]
    assert all(s in env.action_space for s in samples)
    assert any(s.tool_calls for s in samples) and any(not s.tool_calls for s in samples)
    env.action_space.seed(0)
    assert samples == [env.action_space.sample() for _ in range(20)]  # seeded, ids included
    call = ToolCall(name="echo", arguments={"text": "hey"}, id="c9")
    obs = await env.acall_tools(Message(role="assistant", tool_calls=(call,)))
    assert obs == [Message(role="tool", content="hey", tool_call_id="c9", name="echo")]
    no_tools = await SyncEnv().acall_tools(Message(role="assistant", tool_calls=(call,)))
    assert no_tools[0].content.startswith("Error: this environment has no tools")


def test_messages_space_membership() -> None:
    obs_space, act_space = MessagesSpace.observations(), MessagesSpace.actions()
    assert [Message(role="user", content="x")] in obs_space
    assert [Message(role="tool", content="1", tool_call_id="c")] in obs_space
    assert [Message(role="tool", content="1")] not in obs_space  # a tool message needs its call id
    assert [Message(role="assistant", content="x")] not in obs_space
    assert [{"role": "user", "content": "x"}] not in obs_space
    assert "x" not in obs_space
    assert Message(role="assistant", content="x") in act_space
    assert Message(role="user", content="x") not in act_space
    assert Message(role="assistant", content=[{"type": "text", "text": "x"}]) in act_space
