"""bench/LongTail-v0: seeded long-tailed turns and tool waits, a content-disjoint eval split,
clear observations for bad actions, and the demonstration solving every task."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest

from agentrl.env import make_env
from agentrl.errors import ConfigError
from agentrl.splits import reset_in_split, split_of
from agentrl.types import Message, ToolCall
from envs.longtail import RUNNING, LongTailEnv, lognormal_p99


def _env(**kw: object) -> LongTailEnv:
    env = make_env("bench/LongTail-v0", **kw).unwrapped
    assert isinstance(env, LongTailEnv)
    return env


def call(expression: str, id: str = "c1") -> Message:
    tc = ToolCall(name="calculator", arguments={"expression": expression}, id=id)
    return Message(role="assistant", content="", tool_calls=(tc,))


def _shapes(env: LongTailEnv, seeds: range) -> list[tuple[str, int, float]]:
    out = []
    for s in seeds:
        env.reset(seed=s)
        out.append((env.expression, env.calls_needed, env.latency_s))
    return out


def test_turns_and_waits_are_seeded_and_long_tailed() -> None:
    a, b = _env(), _env()
    assert _shapes(a, range(50)) == _shapes(b, range(50))  # same seed, same task and shape
    shapes = _shapes(a, range(3000))
    ks = [k for _, k, _ in shapes]
    lat = [w for _, _, w in shapes]
    assert min(ks) >= 1 and max(ks) <= 12
    assert np.percentile(ks, 50) == 3 and 5 <= np.percentile(ks, 90) <= 7
    assert 0.04 <= statistics.median(lat) <= 0.06 and 0.16 <= np.percentile(lat, 90) <= 0.24
    assert lognormal_p99(0.05, 0.2) == pytest.approx(np.percentile(lat, 99), rel=0.2)
    scaled = _env(latency_scale=0.5)
    assert [w for _, _, w in _shapes(scaled, range(20))] == pytest.approx(
        [0.5 * w for w in lat[:20]]
    )


def test_eval_split_is_disjoint_by_content() -> None:
    env = _env(latency_scale=0.0)

    async def tasks(split: str) -> set[str]:
        out = set()
        for s in range(300):
            obs, info = await reset_in_split(env, seed=s, split=split, eval_fraction=0.25)  # type: ignore[arg-type]
            assert split_of(env.task_key(obs, info), 0.25) == split
            out.add(env.expression)
        return out

    train, ev = asyncio.run(tasks("train")), asyncio.run(tasks("eval"))
    assert len(ev) > 20 and len(train) > 100 and not (train & ev)


def test_job_needs_k_calls_each_waiting_then_the_answer_scores() -> None:
    env = _env(latency_scale=0.2)
    seed = next(s for s in range(100) if (env.reset(seed=s), env.calls_needed)[1] >= 3)
    env.reset(seed=seed)
    k, wait = env.calls_needed, env.latency_s
    t0 = time.perf_counter()
    for i in range(k - 1):
        obs, reward, done, _, _ = env.step(call(env.expression, f"c{i}"))
        assert obs[0].content == RUNNING and reward == 0.0 and not done
    obs, *_ = env.step(call(env.expression, "last"))
    assert obs[0].content == env.value
    assert time.perf_counter() - t0 >= 0.9 * k * wait and env.tool_wait_s == pytest.approx(k * wait)
    _, reward, done, _, info = env.step(Message(role="assistant", content=f"Answer: {env.value}"))
    assert done and reward == 1.0 and info["success"]


def test_bad_actions_get_clear_observations_and_no_reward() -> None:
    env = _env(latency_scale=0.0)
    env.reset(seed=next(s for s in range(100) if (env.reset(seed=s), env.calls_needed)[1] >= 2))
    obs, *_ = env.step(call("7 * "))
    assert obs[0].content.startswith("Error:") and "invalid expression" in obs[0].content
    assert env.calls == 0  # a bad call does not advance the job
    bad = ToolCall(name="calc", arguments={"expression": "1"}, id="x")
    obs, *_ = env.step(Message(role="assistant", content="", tool_calls=(bad,)))
    assert "no tool named 'calc'" in obs[0].content and "calculator" in obs[0].content
    # answering before the job returned the value earns nothing
    _, reward, done, _, info = env.step(Message(role="assistant", content=f"Answer: {env.value}"))
    assert done and reward == 0.0 and not info["success"]


def test_demonstration_polls_until_the_value_and_solves_the_task() -> None:
    env = _env(latency_scale=0.0)
    for seed in range(20):
        env.reset(seed=seed)
        demo = env.demonstration()
        assert demo is not None
        calls = [m for m in demo if m.tool_calls]
        assert len(calls) == env.calls_needed
        env.reset(seed=seed)
        replies = [m for m in demo if m.role == "assistant"]
        for m in replies[:-1]:
            assert not env.step(m)[2]
        _, reward, done, _, _ = env.step(replies[-1])
        assert done and reward == 1.0


def test_bad_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_turns"):
        LongTailEnv(max_calls=5, max_turns=4)
    with pytest.raises(ConfigError, match="p50 <= p90"):
        LongTailEnv(turns_p50=4, turns_p90=2)
