"""The Env base: one way to write an env (async), the SyncEnv adapter, the sync wrappers,
seeding through super(), the deprecated sync overrides, spaces, tool execution."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from agentrl.env import Env, SyncEnv
from agentrl.env_checker import check_env
from agentrl.spaces import MessagesSpace
from agentrl.tool import ToolSet, tool
from agentrl.types import Message, ToolCall


class AsyncEcho(Env):
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        return [Message(role="user", content=str(self.np_random.integers(1000)))], {}

    async def astep(self, action: Message):
        return [Message(role="user", content=action.text.upper())], 1.0, True, False, {}


class SyncEcho(SyncEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return [Message(role="user", content=str(self.np_random.integers(1000)))], {}

    def step(self, action: Message):
        return [Message(role="user", content=action.text.upper())], 1.0, True, False, {}


@pytest.mark.parametrize("cls", [SyncEcho, AsyncEcho])
async def test_async_api_and_seeding_for_async_envs_and_the_sync_adapter(cls: type[Env]) -> None:
    env = cls()
    a, _ = await env.areset(seed=3)
    b, _ = await env.areset(seed=3)
    c, _ = await env.areset(seed=4)
    assert a == b and a != c
    obs, reward, terminated, _, _ = await env.astep(Message(role="assistant", content="hi"))
    assert (obs[0].content, reward, terminated) == ("HI", 1.0, True)
    await env.aclose()


@pytest.mark.parametrize("cls", [SyncEcho, AsyncEcho])
def test_sync_api_for_async_envs_and_the_sync_adapter(cls: type[Env]) -> None:
    env = cls()
    assert env.reset(seed=3) == env.reset(seed=3)
    assert env.reset(seed=3) == asyncio.run(env.areset(seed=3))
    assert env.step(Message(role="assistant", content="x"))[0][0].content == "X"
    env.close()


async def test_the_sync_wrappers_refuse_to_run_inside_an_event_loop() -> None:
    with pytest.raises(
        RuntimeError, match=r"await areset\(\)/astep\(\)/aclose\(\)/ademonstration\(\) instead"
    ):
        AsyncEcho().reset(seed=0)


def test_an_env_implementing_nothing_cannot_be_built() -> None:
    class Empty(Env):
        pass

    class OnlyReset(SyncEnv):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            return [Message(role="user", content="x")], {}

    with pytest.raises(TypeError, match="abstract methods areset, astep"):
        Empty()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="abstract method step"):
        OnlyReset()  # type: ignore[abstract]


def test_an_unmodified_sync_env_on_the_old_base_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning) as caught:

        class Legacy(Env):
            def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
                super().reset(seed=seed)
                return [Message(role="user", content=str(self.np_random.integers(1000)))], {}

            def step(self, action: Message):
                return [Message(role="user", content=action.text.upper())], 1.0, True, False, {}

    (w,) = caught
    msg = str(w.message)
    assert "Legacy overrides reset()/step() of agentrl.env.Env" in msg
    assert "subclass agentrl.env.SyncEnv instead of Env" in msg and "agentrl 0.3" in msg
    assert w.filename == __file__  # points at the class statement, not at agentrl
    assert issubclass(Legacy, SyncEnv)
    env = Legacy()
    assert env.reset(seed=3) == env.reset(seed=3) == asyncio.run(env.areset(seed=3))
    assert asyncio.run(env.astep(Message(role="assistant", content="x")))[0][0].content == "X"
    assert check_env(env).passed

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a subclass of an adopted class is a SyncEnv: no warning

        class Child(Legacy):
            def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
                return super().reset(seed=seed, options=options)

    assert Child().reset(seed=3) == env.reset(seed=3)


def test_an_async_env_overriding_sync_close_still_closes_with_a_warning() -> None:
    closed: list[str] = []
    with pytest.warns(DeprecationWarning, match=r"write `async def aclose\(self\)`"):

        class OldClose(Env):
            async def areset(self, *, seed: int | None = None, options: Any = None):
                return [Message(role="user", content="x")], {}

            async def astep(self, action: Message):
                return [], 0.0, True, False, {}

            def close(self) -> None:
                closed.append("closed")

    env = OldClose()
    asyncio.run(env.aclose())  # what the kernel calls
    assert closed == ["closed"]
    assert env.reset(seed=0)[0][0].content == "x"  # still an async env


@tool
def echo(text: str) -> str:
    """Echo text."""
    return text


class ToolEnv(AsyncEcho):
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
    no_tools = await AsyncEcho().acall_tools(Message(role="assistant", tool_calls=(call,)))
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
