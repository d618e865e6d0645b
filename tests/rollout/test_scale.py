"""2,000 multi-turn rollouts in flight at once in one process, on one event loop."""

from __future__ import annotations

import asyncio
import threading

from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Sample

N = 2000


async def test_two_thousand_concurrent_multi_turn_rollouts(chatml) -> None:  # type: ignore[no-untyped-def]
    waiting = 0
    all_in = asyncio.Event()

    async def respond(prompt: str, turn: int) -> str:
        nonlocal waiting
        if turn == 1:  # every rollout reaches its second turn before any may finish
            waiting += 1
            if waiting == N:
                all_in.set()
            await all_in.wait()
        return "yes"

    threads = threading.active_count()
    cfg = CollectorConfig(group_size=8, max_concurrency=N, agent="env_driver", max_new_tokens=8)
    c = RolloutCollector(cfg, ScriptedGenerator(chatml, respond), chatml)
    samples = [
        Sample(env_id="test-rollout/Echo-v0", env_kwargs={"turns": 3}) for _ in range(N // 8)
    ]
    async with asyncio.timeout(120):
        groups = await c.collect(samples)
    trajs = [t for g in groups for t in g.trajectories]
    assert waiting == N and len(trajs) == N
    assert all(t.status is RolloutStatus.COMPLETED and t.num_turns == 3 for t in trajs)
    assert threading.active_count() <= threads + 1  # no thread per rollout
