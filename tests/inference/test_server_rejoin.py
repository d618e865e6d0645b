"""A server of a Fleet is SIGKILLed mid-collection: it is restarted on its port, gets the
trainer's current weights and version (checksums equal the other server's) before any request
reaches it, and no rollout is lost meanwhile. Real embedded servers on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.chat import ChatTemplate
from agentrl.errors import ConfigError, ServerUnavailableError
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.inference.supervisor import ServerSupervisor, SupervisedClient
from agentrl.rollout.collector import CollectorConfig
from agentrl.types import RolloutStatus, Sample
from trainers.config import InferenceConfig
from trainers.serving import Fleet

OK = {RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED_LENGTH, RolloutStatus.TRUNCATED_MAX_TURNS}
ROLLOUT = CollectorConfig(
    group_size=4,
    max_concurrency=16,
    max_turns=6,
    max_new_tokens=4,
    agent="env_driver",
    tool_parser=None,
)
FAST = ServerSupervisor.Config(check_interval_s=0.2, backoff_s=0.2, health_timeout_s=2.0)


class Recorder:
    """Passes requests to the Fleet's client, records (server, version) of each answer, and
    SIGKILLs ``victim`` (kill -9 of its pid, as a crash) after ``kill_after`` answers."""

    def __init__(self, fleet: Fleet, victim: ServerProcess, kill_after: int) -> None:
        assert fleet.client is not None
        self.fleet, self.client, self.victim = fleet, fleet.client, victim
        self.kill_after = kill_after
        self.answers: list[tuple[str, int]] = []
        self.killed_pid: int | None = None

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        out = await self.client.generate(input_ids, sampling, session_id=session_id)
        self.answers.append((out.server, out.weight_version))
        if len(self.answers) == self.kill_after and self.killed_pid is None:
            self.killed_pid = self.victim.pid
            assert self.killed_pid is not None
            os.kill(self.killed_pid, signal.SIGKILL)
        return out


def weights_b(path: Path) -> dict[str, torch.Tensor]:
    """What a trainer sends: unique tensors (the tied LM head once, as the engines do)."""
    state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    return {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}


def make_fleet(tmp_path: Path, num_servers: int) -> Fleet:
    cfg = InferenceConfig(num_servers=num_servers, num_threads=1, max_batch_size=16)
    return Fleet(
        cfg, run_seed=0, dtype="float32", device="cpu", log_dir=tmp_path / "logs", supervisor=FAST
    )


def samples(n: int, offset: int = 0) -> list[Sample]:
    return [
        Sample(
            env_id="games/GuessNumber-v0",
            env_kwargs={"high": 1000, "max_turns": 100},
            seed=offset + i,
        )
        for i in range(n)
    ]


def checksums(fleet: Fleet) -> dict[str, tuple[str, int]]:
    assert fleet.client is not None
    sums = fleet.run(fleet.client.weights_checksum(per_tensor=False))
    return {u: (c.overall, c.weight_version) for u, c in sums.items()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_servers", [pytest.param(2, marks=pytest.mark.slow), 1])
def test_killed_server_restarts_rejoins_with_current_weights(
    tiny_model: Path, tiny_model_b: Path, tmp_path: Path, num_servers: int
) -> None:
    fleet = make_fleet(tmp_path, num_servers)
    try:
        fleet.start(tiny_model)
        victim = fleet.servers[0]
        url, first_pid = victim.url, victim.pid
        fleet.sync(weights_b(tiny_model_b), version=1, verify=True)
        template = ChatTemplate.from_pretrained(tiny_model)
        rec = Recorder(fleet, victim, kill_after=12)
        assert fleet.generator is not None
        fleet.generator.inner = rec
        groups = fleet.collect(fleet.collector(ROLLOUT, template), samples(8))
        fleet.wait_for_servers(120)
        after = fleet.collect(fleet.collector(ROLLOUT, template), samples(4, offset=100))
        sums = checksums(fleet)
        metrics = fleet.metrics()
        if num_servers == 2:  # dead at sync time: the sync goes to the survivor, the rejoin
            os.kill(victim.pid or 0, signal.SIGKILL)  # brings the restarted one to version 2
            fleet.sync(weights_b(tiny_model), version=2, verify=True)
            fleet.wait_for_servers(120)
            again = checksums(fleet)
            assert set(again.values()) == {again[url]} and again[url][1] == 2
            assert fleet.metrics()["inference/server_restarts"] == 2.0
    finally:
        fleet.close()
    trajs = [t for g in groups + after for t in g.trajectories]
    assert rec.killed_pid == first_pid and len(trajs) == 4 * 12  # every rollout came back
    assert {t.status for t in trajs} <= OK, {t.error for t in trajs}
    # Same port, a new process, back in routing, counted once.
    assert victim.url == url and victim.pid != first_pid
    assert metrics["inference/server_restarts"] == 1.0
    assert metrics["inference/servers_routable"] == float(num_servers)
    # Its weights and version are the trainer's (and the other server's): checksums agree.
    assert len(sums) == num_servers and set(sums.values()) == {sums[url]} and sums[url][1] == 1
    # No request was answered by the restarted process before it had version 1 (it starts
    # from the model directory, version 0); after the rejoin it takes traffic again.
    assert {v for _, v in rec.answers} == {1}
    assert url in {s for s, _ in rec.answers[len(rec.answers) // 2 :]}


async def test_drained_server_gets_no_request_until_admitted(server: ServerProcess) -> None:
    alias = server.url.replace("127.0.0.1", "localhost")  # a second entry, same process
    sp = SamplingParams(max_new_tokens=2, temperature=0)
    async with SupervisedClient([server.url, alias]) as client:
        client.drain(alias)
        assert client.urls == [server.url] and client.all_backends.keys() == {server.url, alias}
        outs = await asyncio.gather(
            *(client.generate([5, 6], sp, session_id=f"s{i}") for i in range(8))
        )
        assert {o.server for o in outs} == {server.url}
        assert list(await client.weight_versions()) == [server.url]  # control calls skip it too
        client.drain(server.url)
        with pytest.raises(ServerUnavailableError, match="no server is routable"):
            await client.generate([5, 6], sp)  # no supervisor: fails at once
        client.admit(alias)
        client.admit(server.url)
        assert client.urls == [server.url, alias] and client.admissions == 2
        outs = await asyncio.gather(
            *(client.generate([5, 6], sp, session_id=f"t{i}") for i in range(8))
        )
        assert {o.server for o in outs} == {server.url, alias}
        with pytest.raises(ConfigError, match="not one of this client's servers"):
            client.drain("http://127.0.0.1:1")


@pytest.mark.timeout(300)
def test_restarts_are_bounded_then_the_server_stays_out(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = InferenceConfig(num_servers=1, num_threads=1)
    fleet = Fleet(
        cfg,
        run_seed=0,
        dtype="float32",
        device="cpu",
        log_dir=tmp_path / "logs",
        supervisor=ServerSupervisor.Config(check_interval_s=0.2, backoff_s=0.1, restart_attempts=2),
    )
    try:
        fleet.start(tiny_model)
        assert fleet.client is not None
        victim = fleet.servers[0]
        victim.cfg.model = str(tmp_path / "gone")  # every restart now fails at startup
        os.kill(victim.pid or 0, signal.SIGKILL)
        sp = SamplingParams(max_new_tokens=2, temperature=0)
        with pytest.raises(ServerUnavailableError, match="no restart is under way"):
            fleet.run(fleet.client.generate([5, 6], sp))
        metrics = fleet.metrics()
    finally:
        fleet.close()
    assert metrics["inference/server_restarts"] == 0.0
    assert metrics["inference/servers_failed"] == 1.0
    assert metrics["inference/servers_routable"] == 0.0
    assert "restart 2/2" in caplog.text and "gave up on inference server" in caplog.text
