"""GymTextEnv runs plain Gymnasium text envs; MaxTurns and TimeLimit truncate and forward."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import pytest

from agentrl.env import ENVS, Env, make_env, register_env
from agentrl.env_checker import check_env
from agentrl.errors import ConfigError
from agentrl.gym_text import GymTextEnv
from agentrl.types import Message
from agentrl.wrappers import MaxTurns, TimeLimit

WORDS = ("apple", "river", "stone")


class WordChain(gym.Env[str, str]):
    """A plain text env: repeat the shown word; three rounds."""

    observation_space = gym.spaces.Text(max_length=20)
    action_space = gym.spaces.Text(min_length=1, max_length=20)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.round = 0
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return self.word, {"round": 0}

    def step(self, action: str):
        reward = float(action == self.word)
        self.round += 1
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return self.word, reward, self.round >= 3, False, {"round": self.round}


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_gym_text_env_turns_text_into_messages() -> None:
    env = GymTextEnv(WordChain(), instructions="Repeat each word.")
    obs, info = env.reset(seed=0)
    assert obs[0].role == "user" and obs[0].content.startswith("Repeat each word.\n")
    total, terminated = 0.0, False
    while not terminated:
        word = obs[-1].content.splitlines()[-1]
        obs, reward, terminated, _truncated, info = env.step(say(f"  {word} "))
        total += reward
        assert obs[0].content in WORDS and "\n" not in obs[0].content  # instructions only once
    assert total == 3.0 and info["round"] == 3


def test_gym_text_env_rejects_actions_outside_the_inner_space() -> None:
    env = GymTextEnv(WordChain(), parse_action=lambda text: text.strip() or None)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(say("   "))
    assert obs[0].content == "Invalid action ''." and (reward, terminated) == (0.0, False)
    assert info == {"invalid_action": True}


def test_gym_text_env_passes_the_checker_and_makes_by_gym_id() -> None:
    assert check_env(GymTextEnv(WordChain())).passed
    gym.register("agentrl-test/WordChain-v0", entry_point=WordChain)
    try:
        env = GymTextEnv("agentrl-test/WordChain-v0", instructions="Go.")
        assert env.reset(seed=1)[0][0].content.startswith("Go.")
    finally:
        gym.registry.pop("agentrl-test/WordChain-v0")
    with pytest.raises(ConfigError, match="only with a Gymnasium id"):
        GymTextEnv(WordChain(), max_episode_steps=3)


def test_an_unmodified_gym_env_registers_through_the_adapter_and_passes_the_checker() -> None:
    register_env(
        "test-gym/WordChain-v0", GymTextEnv, env=WordChain, instructions="Repeat each word."
    )
    register_env("test-gym/Plain-v0", WordChain)
    try:
        env = make_env("test-gym/WordChain-v0")
        assert isinstance(env, GymTextEnv) and isinstance(env.env, WordChain)
        assert env.reset(seed=0)[0][0].content.startswith("Repeat each word.\n")
        report = check_env("test-gym/WordChain-v0")  # gymnasium's check_env included
        assert report.passed, str(report)
        assert "gymnasium" in {r.name for r in report.results if not r.skipped}
        with pytest.raises(ConfigError, match=r"through the adapter: register_env\("):
            make_env("test-gym/Plain-v0")  # a plain gymnasium.Env is not an agentrl Env
    finally:
        ENVS.unregister("test-gym/WordChain-v0")
        ENVS.unregister("test-gym/Plain-v0")


def test_max_turns_truncates_and_forwards() -> None:
    inner = make_env("arith/Calculator-v0")
    env = MaxTurns(inner, max_turns=2)
    assert env.tools is inner.tools and env.nondeterministic is False
    assert env.unwrapped is inner and env.action_space is inner.action_space
    env.reset(seed=0)
    assert env.demonstration() == inner.demonstration()
    assert env.expression == inner.expression  # other attributes are forwarded  # type: ignore[attr-defined]
    call = inner.demonstration()[0]  # type: ignore[index]
    first = env.step(call)
    assert first[3] is False
    second = env.step(call)
    assert second[3] is True and second[4]["truncated_by"] == "max_turns"
    env.reset(seed=0)
    assert env.turns == 0
    assert check_env(MaxTurns(make_env("games/GuessNumber-v0"), max_turns=10)).passed
    with pytest.raises(ConfigError):
        MaxTurns(inner, max_turns=0)


def test_max_turns_leaves_terminated_steps_alone() -> None:
    env = MaxTurns(make_env("games/GuessNumber-v0"), max_turns=1)
    env.reset(options={"secret": 5})
    _, _reward, terminated, truncated, info = env.step(say("5"))
    assert (terminated, truncated, "truncated_by" in info) == (True, False, False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_limit_truncates_after_the_wall_clock_budget() -> None:
    clock = FakeClock()
    env = TimeLimit(make_env("games/GuessNumber-v0", high=1000), seconds=10.0, clock=clock)
    env.reset(options={"secret": 700})
    clock.now = 5.0
    assert env.step(say("1"))[3] is False
    clock.now = 10.5
    _, _, terminated, truncated, info = env.step(say("2"))
    assert (terminated, truncated, info["truncated_by"]) == (False, True, "time_limit")
    env.reset(options={"secret": 700})  # the budget restarts with the episode
    assert env.step(say("3"))[3] is False


class Stuck(Env):
    nondeterministic = True

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        return [Message(role="user", content="wait")], {}

    async def astep(self, action: Message):
        await asyncio.Event().wait()  # never returns
        raise AssertionError("unreachable")


async def test_time_limit_cancels_a_stuck_async_step() -> None:
    env = TimeLimit(Stuck(), seconds=0.05)
    assert env.nondeterministic is True
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep(say("x"))
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert info["truncated_by"] == "time_limit"
