"""An inference server SIGKILLed mid-rollout in ``train.mode=async`` with two servers.

A real run (Ray workers, two embedded servers over HTTP, the tiny smoke model): one server's
process is killed while requests are in flight on it and admitted batches generate. Those
requests fail over to the other server (``inference/request_failovers``); one request is then
made to fail as when no server can take it (injected ``ServerUnavailableError``), and its
trajectory ends as ``error_inference``: masked out of the loss, counted in
``rollout/status/error_inference`` and kept in its group and the trajectory log. Nothing is
dropped: every step trains exactly its samples (none missing, none twice). The supervisor
restarts the killed server, pushes it the current weights and routes to it again (``server
... rejoined``, ``inference/server_restarts``), and the restarted process answers later
rollouts. 35-60 s on 2 cores: ``slow``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import ServerUnavailableError
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.logging import read_jsonl
from agentrl.types import RolloutStatus
from tests.trainers.test_driver import ray_local, smoke_config  # noqa: F401
from trainers.driver import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

OK = {RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED_LENGTH, RolloutStatus.TRUNCATED_MAX_TURNS}
STEPS = 5
RUN = [
    f"train.steps={STEPS}",
    "train.mode=async",
    "train.max_staleness=2",
    "train.batch_size=4",
    "eval.num_samples=0",
    "checkpoint.every=0",
    "trajectories.per_step=64",
    "inference.num_servers=2",
    "inference.restart.check_interval_s=0.2",
    "inference.restart.backoff_s=0.2",
    "inference.restart.health_timeout_s=2.0",
]


class _Killer:
    """Passes requests to the Fleet's client and records which server (and which of its
    processes) answered each. Once ``after`` answers came back, ``victim`` is SIGKILLed as soon
    as a request is in flight on it; two answers later one request fails as when no server can
    take it over (``ServerUnavailableError``), so one trajectory takes the masked path."""

    def __init__(self, inner: Any, victim: ServerProcess, after: int) -> None:
        self.inner, self.victim, self.after = inner, victim, after
        self.answers: list[tuple[str, int | None]] = []  # (server url, victim pid then)
        self.killed_pid: int | None = None
        self.unavailable = False

    def _victim_busy(self) -> bool:
        return any(s.url == self.victim.url and s.inflight for s in self.inner._all)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        if self.killed_pid and not self.unavailable and len(self.answers) >= self.after + 2:
            self.unavailable = True
            raise ServerUnavailableError("injected: every inference server failed")
        task = asyncio.ensure_future(
            self.inner.generate(input_ids, sampling, session_id=session_id)
        )
        await asyncio.sleep(0)  # the request is on its server
        if self.killed_pid is None and len(self.answers) >= self.after and self._victim_busy():
            self.killed_pid = self.victim.pid
            assert self.killed_pid is not None
            os.kill(self.killed_pid, signal.SIGKILL)
        out = await task
        self.answers.append((out.server, self.victim.pid))
        return out


class _KillOneServer(Trainer):
    """The driver, with a server killed mid-rollout (after the first answers of step 1's
    batches) and, before step 2, a wait until the supervisor has it back in routing."""

    killer: _Killer

    def setup(self) -> None:
        super().setup()
        assert self.fleet is not None and self.fleet.generator is not None
        victim = self.fleet.servers[1]
        self.killer = _Killer(self.fleet.generator.inner, victim, after=3)
        self.fleet.generator.inner = self.killer

    def step(self) -> dict[str, float]:
        if self.step_done == 1:  # the rejoin takes a server start: wait, so that the batch
            # admitted by step 2's sync (step 5's) generates with both servers routable
            assert self.fleet is not None
            self.fleet.wait_for_servers(120)
            for _ in range(600):
                m = self.fleet.metrics()
                if m["inference/server_restarts"] >= 1 and m["inference/servers_routable"] == 2:
                    break
                self.fleet.run(asyncio.sleep(0.2))
        return super().step()


def test_async_run_survives_a_server_killed_mid_rollout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trainers.serving")
    cfg = smoke_config(tmp_path, *RUN, "name=fault")
    trainer = _KillOneServer(cfg)
    trainer.run()

    killer = trainer.killer
    rows = read_jsonl(cfg.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # the run went on
    assert killer.killed_pid is not None

    # Every step trained exactly its samples, each group whole: none dropped, none twice.
    size = cfg.rollout.group_size
    batch = cfg.train.batch_size
    seen: set[str] = set()
    for r in rows:
        s = r["step"]
        path = cfg.run_dir / "trajectories" / f"step_{s:06d}.jsonl"
        logged = [json.loads(line) for line in path.read_text().splitlines()]
        uids = Counter(t["sample"]["uid"] for t in logged)
        want = [cfg.data.sample(i).uid for i in range((s - 1) * batch, s * batch)]
        assert uids == Counter({u: size for u in want}), s
        assert not seen & set(uids)
        seen |= set(uids)
        # Failed trajectories are kept, marked and counted (masked out of the loss), not dropped.
        statuses = [RolloutStatus(t["status"]) for t in logged]
        assert set(statuses) <= OK | {RolloutStatus.ERROR_INFERENCE}, statuses
        failed = sum(st is RolloutStatus.ERROR_INFERENCE for st in statuses) / len(statuses)
        assert r["rollout/status/error_inference"] == pytest.approx(failed)

    # The requests in flight on the killed server were retried on the other one; the request
    # that found no server left its trajectory in its group as error_inference (masked).
    last = rows[-1]
    assert last["inference/request_failovers"] > 0
    assert killer.unavailable
    masked = sum(r["rollout/status/error_inference"] for r in rows) * batch * size
    assert masked == pytest.approx(1.0)
    # Restarted on its port, rejoined with the current weights, routed to again.
    assert last["inference/server_restarts"] == 1.0
    assert last["inference/servers_routable"] == 2.0
    assert any("rejoined at version" in m for m in caplog.messages), caplog.messages[-20:]
    url = killer.victim.url
    after = [pid for u, pid in killer.answers if u == url and pid != killer.killed_pid]
    assert after, "the restarted server answered no request"
