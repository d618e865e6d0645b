"""RolloutCollector: streaming without a batch barrier, grouping, failure statuses, limits,
concurrency bound and aggregated metrics."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.agent import AGENTS, AgentLoop, register_agent
from agentrl.errors import ConfigError, InferenceError, RewardError, UnknownIdError
from agentrl.reward import Rubric
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Sample


def collector(chatml, gen, **cfg) -> RolloutCollector:  # type: ignore[no-untyped-def]
    cfg.setdefault("agent", "env_driver")
    return RolloutCollector(CollectorConfig(**cfg), gen, chatml)


async def test_fast_group_is_yielded_before_a_slow_one(chatml) -> None:  # type: ignore[no-untyped-def]
    release = asyncio.Event()

    async def respond(prompt: str, turn: int) -> str:
        if "slow" in prompt:
            await release.wait()  # only a yielded fast group releases the slow one
        return "yes"

    c = collector(chatml, ScriptedGenerator(chatml, respond), group_size=3)
    slow = Sample(env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "slow one"})
    fast = Sample(env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "fast one"})
    order = []
    stream = c.stream([slow, fast])
    async with asyncio.timeout(30):
        async for group in stream:
            order.append(group.uid)
            release.set()
    assert order == [fast.uid, slow.uid]


async def test_groups_share_uid_and_metrics_aggregate(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, lambda p, t: "yes" if "even" in p else "no")
    samples = [
        Sample(
            env_id="test-rollout/Echo-v0",
            env_kwargs={"prompt": f"{'even' if i % 2 == 0 else 'odd'} {i}", "turns": 2},
        )
        for i in range(4)
    ]
    c = collector(chatml, gen, group_size=2)
    groups = await c.collect(iter(samples))
    assert sorted(g.uid for g in groups) == sorted(s.uid for s in samples)
    for g in groups:
        assert len(g.trajectories) == 2 and {t.sample.uid for t in g.trajectories} == {g.uid}
        assert len({t.id for t in g.trajectories}) == 2
    m = RolloutCollector.metrics(groups)
    assert m["rollout/num_trajectories"] == 8
    assert m["rollout/reward_mean"] == 0.5 and m["rollout/success_rate"] == 0.5
    assert m["rollout/turns_mean"] == 2.0
    assert m["rollout/status/completed"] == 1.0 and m["rollout/status/error_env"] == 0.0
    assert m["rollout/response_len_mean"] > 0


async def test_failures_become_statuses_and_spare_siblings(chatml) -> None:  # type: ignore[no-untyped-def]
    calls = 0

    async def respond(prompt: str, turn: int) -> str:
        nonlocal calls
        calls += 1
        if "boom" in prompt and calls % 2 == 0:
            raise InferenceError("server 127.0.0.1:1 went away")
        if "kaput" in prompt:
            raise ConnectionResetError("peer reset")  # not an agentrl error: still error_inference
        return "yes"

    c = collector(chatml, ScriptedGenerator(chatml, respond), group_size=4, max_concurrency=1)
    env = "test-rollout/Echo-v0"
    samples = {
        "reset": Sample(env_id="test-rollout/Broken-v0", env_kwargs={"where": "reset"}),
        "step": Sample(env_id="test-rollout/Broken-v0", env_kwargs={"where": "step"}),
        "no_env": Sample(env_id="test-rollout/Nope-v0"),
        "boom": Sample(env_id=env, env_kwargs={"prompt": "boom"}),
        "kaput": Sample(env_id=env, env_kwargs={"prompt": "kaput"}),
        "sandbox": Sample(env_id="test-rollout/Sandbox-v0", agent="tool_calling"),
        "ok": Sample(env_id=env),
    }
    # the sandbox env's model calls its (dead) sandbox tool
    sandbox_call = (
        '<tool_call>{"name": "flaky_sandbox", "arguments": {"command": "ls"}}</tool_call>'
    )
    c.generator = ScriptedGenerator(
        chatml, lambda p, t: sandbox_call if "flaky_sandbox" in p else respond(p, t)
    )
    groups = {g.uid: g for g in await c.collect(samples.values())}
    statuses = {k: [t.status for t in groups[s.uid].trajectories] for k, s in samples.items()}
    assert statuses["reset"] == [RolloutStatus.ERROR_ENV] * 4
    assert statuses["step"] == [RolloutStatus.ERROR_ENV] * 4
    assert statuses["no_env"] == [RolloutStatus.ERROR_ENV] * 4
    assert sorted(statuses["boom"]) == sorted(
        [RolloutStatus.ERROR_INFERENCE] * 2 + [RolloutStatus.COMPLETED] * 2
    )
    assert statuses["kaput"] == [RolloutStatus.ERROR_INFERENCE] * 4
    assert statuses["sandbox"] == [RolloutStatus.ERROR_SANDBOX] * 4
    assert statuses["ok"] == [RolloutStatus.COMPLETED] * 4
    err = groups[samples["reset"].uid].trajectories[0].error
    assert err is not None and "reset exploded" in err
    assert "did you mean" in (groups[samples["no_env"].uid].trajectories[0].error or "").lower()
    assert not groups[samples["boom"].uid].trainable and groups[samples["ok"].uid].trainable


async def test_rubric_scores_groups_and_its_failure_is_error_reward(chatml) -> None:  # type: ignore[no-untyped-def]
    def length_bonus(traj, info) -> float:  # type: ignore[no-untyped-def]
        if "fail" in info["sample"].env_kwargs.get("prompt", ""):
            raise RewardError("judge unavailable")
        return 0.5 + info["env_reward"]

    gen = ScriptedGenerator(chatml, ["yes"])
    c = RolloutCollector(
        CollectorConfig(group_size=2, agent="single_turn"),
        gen,
        chatml,
        rubric=Rubric([length_bonus]),
    )
    ok, bad = (
        Sample(env_id="test-rollout/Echo-v0"),
        Sample(env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "fail"}),
    )
    groups = {g.uid: g for g in await c.collect([ok, bad])}
    assert [t.reward for t in groups[ok.uid].trajectories] == [1.5, 1.5]
    assert groups[ok.uid].trajectories[0].reward_components == {"length_bonus": 1.5}
    assert [t.status for t in groups[bad.uid].trajectories] == [RolloutStatus.ERROR_REWARD] * 2
    assert "judge unavailable" in (groups[bad.uid].trajectories[0].error or "")


async def test_timeout_and_abort_are_aborted(chatml) -> None:  # type: ignore[no-untyped-def]
    hang = asyncio.Event()

    async def respond(prompt: str, turn: int) -> str:
        await hang.wait()
        return "yes"

    c = collector(chatml, ScriptedGenerator(chatml, respond), group_size=2, timeout_s=0.05)
    [g] = await c.collect([Sample(env_id="test-rollout/Echo-v0")])
    assert [t.status for t in g.trajectories] == [RolloutStatus.ABORTED] * 2
    assert "timeout_s" in (g.trajectories[0].error or "")

    c = collector(chatml, ScriptedGenerator(chatml, respond), group_size=3)
    task = asyncio.create_task(c.collect([Sample(env_id="test-rollout/Echo-v0")]))
    while len(c._inflight) < 3:
        await asyncio.sleep(0.01)
    assert c.abort() == 3
    [g] = await task
    assert [t.status for t in g.trajectories] == [RolloutStatus.ABORTED] * 3


async def test_concurrency_is_bounded(chatml) -> None:  # type: ignore[no-untyped-def]
    active = peak = 0

    async def respond(prompt: str, turn: int) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.001)
        active -= 1
        return "yes"

    c = collector(chatml, ScriptedGenerator(chatml, respond), group_size=4, max_concurrency=6)
    groups = await c.collect(
        Sample(env_id="test-rollout/Echo-v0", env_kwargs={"turns": 2}) for _ in range(10)
    )
    assert len(groups) == 10 and peak == 6


def test_config_is_validated(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, ["x"])
    with pytest.raises(ConfigError, match="group_size"):
        RolloutCollector(CollectorConfig(group_size=0), gen, chatml)
    with pytest.raises(UnknownIdError, match="Did you mean"):
        RolloutCollector(CollectorConfig(agent="tool_caling"), gen, chatml)


class CountingLoop(AgentLoop):
    """env_driver plus a loop-specific metric."""

    async def run(self, sample, ctx):  # type: ignore[no-untyped-def]
        await ctx.reset()
        reply = await ctx.generate()
        ctx.metrics["drafts"] = 2.0 if "even" in ctx.messages[0].text else 4.0
        ctx.metrics["reward"] = 7.0  # a name the built-in keys already use
        await ctx.step(reply.message)


async def test_custom_metrics_aggregate_and_trajectories_name_their_loop(chatml) -> None:  # type: ignore[no-untyped-def]
    register_agent("test-counting", CountingLoop)
    try:
        c = collector(chatml, ScriptedGenerator(chatml, ["yes"] * 8), group_size=2)
        samples = [
            Sample(env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "even"}),
            Sample(
                env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "odd"}, agent="test-counting"
            ),
            Sample(
                env_id="test-rollout/Echo-v0", env_kwargs={"prompt": "even"}, agent="test-counting"
            ),
        ]
        groups = await c.collect(samples)
    finally:
        AGENTS.unregister("test-counting")
    agents = {t.sample.agent: t.agent for g in groups for t in g.trajectories}
    assert agents == {None: "env_driver", "test-counting": "test-counting"}
    m = RolloutCollector.metrics(groups)
    assert m["rollout/drafts_mean"] == 3.0  # over the 4 trajectories that report it
    assert m["rollout/custom/reward_mean"] == 7.0 and m["rollout/reward_mean"] == 1.0
    assert "rollout/tool_calls_mean" in m and "rollout/tool_calls_mean_mean" not in m


async def test_an_unknown_per_sample_loop_fails_once_not_per_rollout(chatml) -> None:  # type: ignore[no-untyped-def]
    c = collector(chatml, ScriptedGenerator(chatml, ["yes"]), group_size=4)
    with pytest.raises(UnknownIdError, match="--module"):
        await c.collect([Sample(env_id="test-rollout/Echo-v0", agent="no-such-loop")])
