"""Two real servers, one SIGKILLed mid-rollout: its trajectories move to the other server (or
end as error_inference), every other trajectory completes, and nothing hangs."""

from __future__ import annotations

from collections import defaultdict

import pytest

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import RolloutStatus, Sample

OK = {RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED_LENGTH, RolloutStatus.TRUNCATED_MAX_TURNS}


class KillAfter:
    """Passes requests to the client; SIGKILLs ``victim`` once ``n`` completions came back."""

    def __init__(self, client: InferenceClient, victim: ServerProcess, n: int) -> None:
        self.client, self.victim, self.n = client, victim, n
        self.done = 0
        self.killed = False
        self.servers_by_session: dict[str, list[str]] = defaultdict(list)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        out = await self.client.generate(input_ids, sampling, session_id=session_id)
        self.servers_by_session[session_id or ""].append(out.server)
        self.done += 1
        if self.done >= self.n and not self.killed:
            self.killed = True
            self.victim.kill()
        return out


@pytest.mark.timeout(300)
async def test_killing_one_of_two_servers_mid_rollout(tmp_path) -> None:
    path = make_tiny_model(tmp_path / "model")
    template = ChatTemplate.from_pretrained(path)
    cfg = ServerProcess.Config(model=str(path), max_batch_size=32, num_threads=1)
    with ServerProcess(cfg) as survivor, ServerProcess(cfg) as victim:
        async with InferenceClient([survivor.url, victim.url]) as client:
            gen = KillAfter(client, victim, n=48)
            collector = RolloutCollector(
                CollectorConfig(
                    group_size=4,
                    max_concurrency=32,
                    max_turns=4,
                    max_new_tokens=4,
                    agent="env_driver",
                    tool_parser=None,
                ),
                gen,
                template,
            )
            samples = [
                Sample(
                    env_id="games/GuessNumber-v0",
                    env_kwargs={"high": 1000, "max_turns": 100},
                    seed=i,
                )
                for i in range(8)
            ]
            groups = [g async for g in collector.stream(samples)]
    assert gen.killed
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 32, "every trajectory comes back"
    assert {t.status for t in trajs} <= OK | {RolloutStatus.ERROR_INFERENCE}, {
        t.error for t in trajs
    }
    # Sessions that were on the killed server before the kill and continued on the survivor.
    moved = [
        s
        for s, used in gen.servers_by_session.items()
        if victim.url in used
        and used[-1] == survivor.url
        and used.index(victim.url) < len(used) - 1
    ]
    assert moved, "some trajectories should have failed over to the surviving server"
    finished = sum(1 for t in trajs if t.status in OK)
    assert finished >= 24, f"only {finished}/32 finished"
