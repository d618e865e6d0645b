"""``train.mode`` without a model: config checks, admission control, staleness, version races.

The producer (``AsyncRollouts``) is driven by a simulated trainer on a plain event loop with
fake collectors that tag each group with the weight versions live while it generated; the
version race runs the real collector and ledger against a generator whose weights change
between a request and its response.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.batch import TrainBatch
from agentrl.chat import ChatTemplate
from agentrl.errors import ConfigError, TrainingError
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.rollout.collector import CollectorConfig
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup
from trainers.async_rollout import (
    AsyncRollouts,
    DrainTimeout,
    staleness_bound,
    staleness_metrics,
)
from trainers.config import load_run_config
from trainers.serving import SeededCollector, SeededGenerator

ENV = "data.envs=[{id: arith/Calculator-v0}]"


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["train.mode=offpolicy"], "sync, one_step_off, async"),
        (["train.max_staleness=1"], r"only for train.mode=async.*staleness is always 0"),
        (["train.mode=one_step_off", "train.max_staleness=2"], "is always 1"),
        (["train.mode=async"], "needs train.max_staleness"),
        (["train.mode=async", "train.max_staleness=-1"], ">= 0"),
        (["train.mode=one_step_off", "algo.adv_estimator=remax"], "not built"),
    ],
)
def test_invalid_mode_combinations_are_config_errors(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_run_config(None, [ENV, *overrides])


def test_valid_modes_and_their_bounds() -> None:
    for overrides, bound in (
        ([], 0),
        (["train.mode=one_step_off"], 1),
        (["train.mode=async", "train.max_staleness=3"], 3),
    ):
        t = load_run_config(None, [ENV, *overrides]).train
        assert staleness_bound(t.mode, t.max_staleness) == bound


# ---------------------------------------------------------------------------- admission
def _sample(i: int) -> Sample:
    return Sample(env_id="e", seed=i, uid=f"train-{i}")


def _group(sample: Sample, versions: list[int]) -> TrajectoryGroup:
    seg = Segment()
    seg.extend_prompt([1, 2])
    seg.extend_generated([3] * len(versions), [-0.5] * len(versions), versions)
    traj = Trajectory(sample=sample, segments=[seg], reward=1.0)
    return TrajectoryGroup(uid=sample.uid, trajectories=[traj])


class _Sim:
    """A trainer's version and a fake collector whose groups take random times; each group's
    tokens carry the versions that were live while it generated (an update lands mid-rollout)."""

    def __init__(self, seed: int = 0, gen_s: float = 0.01) -> None:
        self.version = 0
        self.rng = random.Random(seed)
        self.gen_s = gen_s
        self.started: list[tuple[int, int]] = []  # (sample index, version at start)
        self.forgotten: list[str] = []

    async def collect(
        self, samples: Sequence[Sample], on_group: Callable[[TrajectoryGroup], None] | None = None
    ) -> list[TrajectoryGroup]:
        async def one(s: Sample) -> TrajectoryGroup:
            self.started.append((s.seed or 0, self.version))
            versions = [self.version]
            for _ in range(3):
                await asyncio.sleep(self.rng.random() * self.gen_s)
                versions.append(self.version)
            g = _group(s, versions)
            if on_group is not None:
                on_group(g)
            return g

        return list(await asyncio.gather(*(one(s) for s in samples)))


def _producer(sim: _Sim, loop: asyncio.AbstractEventLoop, mode: str, bound: int) -> AsyncRollouts:
    return AsyncRollouts(
        mode=mode,
        bound=bound,
        batch_size=3,
        first_step=1,
        last_step=6,
        first_sample=0,
        sample=_sample,
        collect=sim.collect,
        forget=sim.forgotten.extend,
        version=lambda: sim.version,
        loop=loop,
    )


def _train(sim: _Sim, rollouts: AsyncRollouts, steps: int, train_s: float) -> list[list[str]]:
    """The driver's step order: take the batch, check staleness, train (overlapped), sync."""
    trained = []
    for step in range(1, steps + 1):
        groups, m = rollouts.next_batch(step)
        assert m["async/buffer_groups"] >= 0 and m["async/in_flight_groups"] >= 0
        batch = TrainBatch.from_groups(groups, pad_token_id=0)
        staleness_metrics(batch.versions, batch.loss_mask, sim.version, rollouts.bound)
        rollouts.overlap(lambda: __import__("time").sleep(sim.rng.random() * train_s))
        sim.version += 1
        rollouts.after_sync()
        trained.append([g.uid for g in groups])
    return trained


@pytest.mark.parametrize(("mode", "bound"), [("async", 0), ("one_step_off", 1), ("async", 2)])
def test_batches_are_data_order_within_the_bound_nothing_lost(mode: str, bound: int) -> None:
    for seed in range(3):
        sim, loop = _Sim(seed), asyncio.new_event_loop()
        try:
            rollouts = _producer(sim, loop, mode, bound)
            trained = _train(sim, rollouts, steps=6, train_s=0.02)
        finally:
            loop.close()
        assert trained == [[f"train-{i}" for i in range(3 * s, 3 * s + 3)] for s in range(6)]
        for index, version in sim.started:  # admission control: step s starts at >= s-1-bound
            assert version >= index // 3 - bound
        assert sorted(sim.forgotten) == sorted(f"train-{i}" for i in range(18))


def test_staleness_zero_never_generates_ahead() -> None:
    sim, loop = _Sim(), asyncio.new_event_loop()
    try:
        rollouts = _producer(sim, loop, "async", 0)
        rollouts.next_batch(1)
        assert not rollouts.admissible(2)  # version 0: step 2 must wait for version 1
        sim.version = 1
        assert rollouts.admissible(2)
    finally:
        rollouts.close()
        loop.close()


def test_one_step_off_admits_the_next_batch_once_the_last_finished() -> None:
    sim, loop = _Sim(gen_s=0.05), asyncio.new_event_loop()
    try:
        rollouts = _producer(sim, loop, "one_step_off", 1)
        rollouts.admit()
        assert [i for i, _ in sim.started] == []  # tasks start when the loop runs
        assert not rollouts.admissible(2)  # step 1 still generating
        rollouts.next_batch(1)  # step 1 finished: its done callback admitted step 2
        loop.run_until_complete(asyncio.sleep(0))
        assert sorted(i for i, _ in sim.started) == list(range(6))
        assert not rollouts.admissible(3)  # version 0 < 3 - 2
    finally:
        rollouts.close()
        loop.close()


def test_close_cancels_in_flight_batches() -> None:
    sim, loop = _Sim(gen_s=1.0), asyncio.new_event_loop()
    rollouts = _producer(sim, loop, "async", 5)
    rollouts.admit()
    loop.run_until_complete(asyncio.sleep(0.01))
    rollouts.close()
    assert not rollouts.admissible(1)
    assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
    loop.close()


@pytest.mark.parametrize(("mode", "bound", "admitted"), [("async", 2, 3), ("one_step_off", 1, 1)])
def test_drain_admits_nothing_more_and_finishes_the_admitted_batches(
    mode: str, bound: int, admitted: int
) -> None:
    """Ctrl-C's drain: the admitted batches (async bound 2: steps 1-3; one_step_off: step 1)
    finish and are taken whole; no later batch is admitted, even once the version (or, in
    one_step_off, the previous batch finishing) would allow it."""
    sim, loop = _Sim(gen_s=0.05), asyncio.new_event_loop()
    try:
        rollouts = _producer(sim, loop, mode, bound)
        rollouts.admit()
        assert rollouts.admitted() == list(range(1, admitted + 1))
        rollouts.drain(timeout_s=30)
        trained = _train(sim, rollouts, steps=admitted, train_s=0.01)
        want = [[f"train-{i}" for i in range(3 * s, 3 * s + 3)] for s in range(admitted)]
        assert trained == want
        loop.run_until_complete(asyncio.sleep(0.01))  # one_step_off's done callbacks
        assert rollouts.admitted() == [] and not rollouts.admissible(admitted + 1)
        assert sorted(i for i, _ in sim.started) == list(range(3 * admitted))
    finally:
        rollouts.close()
        loop.close()


def test_drain_past_its_timeout_raises_and_close_cancels_the_rest() -> None:
    sim, loop = _Sim(gen_s=2.0), asyncio.new_event_loop()
    rollouts = _producer(sim, loop, "async", 1)
    rollouts.admit()
    loop.run_until_complete(asyncio.sleep(0.01))
    rollouts.drain(timeout_s=0.2)
    with pytest.raises(DrainTimeout, match="drain_timeout_s"):
        rollouts.next_batch(1)
    assert rollouts.admitted() == [1, 2]  # still held, so close() cancels them
    rollouts.close()
    assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
    loop.close()


# ---------------------------------------------------------------------------- staleness
def test_staleness_histogram_and_the_bound() -> None:
    versions = torch.tensor([[-1, 3, 3, 4, -1], [-1, 2, 4, -1, -1]])  # (B, T)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    m = staleness_metrics(versions, mask, policy_version=4, bound=2)
    assert m["async/staleness_max"] == 2.0
    assert m["async/staleness_frac_0"] == pytest.approx(2 / 5)
    assert m["async/staleness_frac_1"] == pytest.approx(2 / 5)
    assert m["async/staleness_frac_2"] == pytest.approx(1 / 5)
    with pytest.raises(TrainingError, match="3 weight versions old"):
        staleness_metrics(versions, mask, policy_version=5, bound=2)
    with pytest.raises(TrainingError, match="admission control failed"):
        staleness_metrics(versions, mask, policy_version=3, bound=2)  # a token from the future


# ---------------------------------------------------------------------------- version race
class _RacingServer:
    """A Generator whose weights move to the next version between a request and its response
    (mid-completion for the first request: the tokens after the update carry the new one)."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.version = 7

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        before = self.version
        await asyncio.sleep(0)
        self.version += 1  # the update lands while this request is in flight
        ids = self.template.encode("8") + list(self.template.stop_token_ids[:1])
        versions = [before] + [self.version] * (len(ids) - 1)
        return Completion(
            output_ids=ids,
            output_logprobs=[-0.1] * len(ids),
            finish_reason="stop",
            weight_version=self.version,
            output_versions=versions,
            prompt_tokens=len(input_ids),
        )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    path: Path = make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1)
    return ChatTemplate.from_pretrained(path)


def test_an_update_between_request_and_response_is_tagged_per_token(
    template: ChatTemplate,
) -> None:
    server = _RacingServer(template)
    cfg = CollectorConfig(
        group_size=2, max_turns=2, max_new_tokens=4, agent="env_driver", tool_parser=None
    )
    collector = SeededCollector(cfg, SeededGenerator(server, 0), template)
    samples = [Sample(env_id="games/GuessNumber-v0", seed=1, uid="train-0")]
    groups = asyncio.run(collector.collect_ordered(samples))
    batch = TrainBatch.from_groups(groups, pad_token_id=0)
    generated = batch.versions[batch.loss_mask.bool()]
    assert int(generated.min()) == 7 and int(generated.max()) == server.version
    assert len(set(generated.tolist())) > 2  # tokens of one trajectory span versions
    # Trained by the latest weights, the oldest token's staleness counts, not the newest's.
    span = server.version - 7
    m = staleness_metrics(batch.versions, batch.loss_mask, server.version, bound=span)
    assert m["async/staleness_max"] == span
    with pytest.raises(TrainingError):
        staleness_metrics(batch.versions, batch.loss_mask, server.version, bound=span - 1)


def test_overlap_counts_only_the_time_rollouts_were_in_flight() -> None:
    """``overlap_s``: of a training call, the part during which a later batch generated."""
    import time

    loop = asyncio.new_event_loop()
    sim = _Sim(gen_s=0.0)
    sim.version = 10  # every batch admissible
    rollouts = _producer(sim, loop, "async", 6)

    async def slow(samples: Sequence[Sample], on_group: Any = None) -> list[TrajectoryGroup]:
        await asyncio.sleep(0.3)  # every batch generates for 0.3 s, all at once
        groups = [_group(s, [10]) for s in samples]
        for g in groups:
            on_group(g)
        return groups

    rollouts._collect = slow
    try:
        rollouts.admit()
        rollouts.overlap(lambda: time.sleep(0.6))  # rollouts ran for the first 0.3 s of it
        assert 0.2 < rollouts.overlap_s < 0.45
        rollouts.overlap(lambda: time.sleep(0.3))  # nothing in flight any more
        assert rollouts.overlap_s < 0.05
    finally:
        rollouts.close()
        loop.close()


# ---------------------------------------------------------------------------- filter_groups
def _filter_run(signal: Callable[[int], bool], steps: int) -> tuple[list[Any], list[str]]:
    """``steps`` steps of 3 groups with algo.filter_groups (max 3 rounds); each group has two
    trajectories whose rewards differ when ``signal(sample index)``."""
    forgotten: list[str] = []

    async def collect(
        samples: Sequence[Sample], on_group: Callable[[TrajectoryGroup], None] | None = None
    ) -> list[TrajectoryGroup]:
        out = []
        for s in samples:
            await asyncio.sleep(0)
            trajs = [
                Trajectory(sample=s, segments=[], reward=r)
                for r in ((1.0, 0.0) if signal(s.seed or 0) else (1.0, 1.0))
            ]
            g = TrajectoryGroup(uid=s.uid, trajectories=trajs)
            if on_group is not None:
                on_group(g)
            out.append(g)
        return out

    loop = asyncio.new_event_loop()
    rollouts = AsyncRollouts(
        mode="async",
        bound=1,
        batch_size=3,
        first_step=1,
        last_step=steps,
        first_sample=0,
        sample=_sample,
        collect=collect,
        forget=forgotten.extend,
        version=lambda: 0,
        loop=loop,
        filter_rounds=3,
    )
    try:
        assert rollouts.stride == 9  # a step's block: 3 rounds x 3 samples
        taken = [rollouts.next_batch(1)]
        for step in range(2, steps + 1):
            loop.run_until_complete(asyncio.sleep(0))
            rollouts.bound = step  # as if the versions kept up
            taken.append(rollouts.next_batch(step))
    finally:
        rollouts.close()
        loop.close()
    return taken, forgotten


def test_filter_groups_refills_each_batch_from_its_own_block() -> None:
    taken, forgotten = _filter_run(lambda i: i % 2 == 0, steps=2)
    (g1, m1), (g2, m2) = taken
    # step 1: samples 0-2 (0, 2 kept), then 3 (dropped), then 4; step 2 starts at 9, not 5
    assert [g.uid for g in g1] == ["train-0", "train-2", "train-4"]
    assert [g.uid for g in g2] == ["train-10", "train-12", "train-14"]
    assert m1["rollout/filter_kept_rate"] == pytest.approx(3 / 5)
    assert m2["rollout/filter_kept_rate"] == pytest.approx(3 / 6)
    assert m1["rollout/filter_padded_groups"] == 0.0
    assert m1["async/buffer_groups"] >= 0  # generated-but-untrained groups are accounted for
    assert sorted(forgotten) == sorted(f"train-{i}" for i in [*range(5), *range(9, 15)])


def test_filter_groups_pads_with_flat_groups_after_its_rounds() -> None:
    taken, forgotten = _filter_run(lambda i: False, steps=1)
    ((groups, metrics),) = taken
    assert [g.uid for g in groups] == ["train-0", "train-1", "train-2"]  # the first flat ones
    assert metrics["rollout/filter_padded_groups"] == 3.0
    assert metrics["rollout/filter_kept_rate"] == 0.0
    assert len(forgotten) == 9  # three rounds of three: the whole block, and no more


def test_filter_groups_in_overlapped_modes_needs_bounded_rounds() -> None:
    with pytest.raises(ConfigError, match="max_filter_rounds >= 1"):
        mode = ["train.mode=async", "train.max_staleness=1", "algo.filter_groups=true"]
        load_run_config(None, [ENV, *mode, "algo.max_filter_rounds=0"])
    cfg = load_run_config(None, [ENV, "train.mode=one_step_off", "algo.filter_groups=true"])
    assert cfg.algo.filter_groups and cfg.algo.max_filter_rounds == 4
