"""Rollout workers as Ray actors on a second Ray node (``rollout_workers``, issue 23).

The cluster is two real Ray nodes on this machine (``ray.cluster_utils.Cluster``, loopback,
each with its own raylet and ports): the head, where the driver, the training workers and the
inference server run, and a second node that offers a custom resource ``rollout_node`` and no
CPUs, so only the rollout workers (which ask for that resource) can be placed on it.

- A worker whose process dies mid-group (``os._exit``) is restarted by Ray and the group runs
  again on a live worker: it comes back whole, once, and ``retried`` counts it; a worker that
  dies on every attempt gives a group of ``aborted`` members, never a missing group.
- ``async`` with ``max_staleness=0`` and two workers on the second node (and
  ``inference.interrupt: abort``, whose pauses the workers' clients are told of) trains exactly
  what ``sync`` on the driver trains: the request seeds depend only on the sample, not on the
  process.

The two end-to-end runs take 2-4 minutes on 2 cores: ``slow``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import ConfigError
from agentrl.gpu_env import MULTICAST_OFF
from agentrl.logging import read_jsonl
from agentrl.rollout.collector import CollectorConfig
from agentrl.types import RolloutStatus, Sample, Trajectory, TrajectoryGroup
from tests.conftest import process_env
from tests.trainers.test_async_modes import SHORT as ASYNC_SHORT
from tests.trainers.test_driver import deterministic, smoke_config
from trainers.config import RewardConfig, RolloutWorkersConfig
from trainers.driver import Trainer
from trainers.rollout_workers import RolloutWorkerPool, WorkerSpec

NODE_RESOURCE = "rollout_node"


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    """A head node (2 CPUs) and a second node offering only ``rollout_node`` slots."""
    import ray
    from ray.cluster_utils import Cluster

    from agentrl.distributed.ray_utils import single_machine_mode

    if ray.is_initialized():
        ray.shutdown()
    with single_machine_mode():  # every node keeps 127.0.0.1 (see ray_utils)
        os.environ["RAY_SCHEDULER_EVENTS"] = "0"
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 2,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
            },
        )
        node = cluster.add_node(
            num_cpus=0, resources={NODE_RESOURCE: 4}, node_ip_address="127.0.0.1"
        )
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False)
    try:
        yield node
    finally:
        ray.shutdown()
        cluster.shutdown()


# ---------------------------------------------------------------------- fakes for the pool


class _DiesOnce:
    """A rollout worker that kills its own process on its first group (a marker file says
    whether it did already), then answers every group with one completed member per slot."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    async def run_group(self, sample: Sample) -> TrajectoryGroup:
        try:  # exactly one process wins the marker (two may reach here at once)
            fd = os.open(sample.extra["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os._exit(1)  # the process dies mid-group, as on an OOM kill
        await asyncio.sleep(0.01)
        members = [
            Trajectory(sample=sample, status=RolloutStatus.COMPLETED, reward=float(os.getpid()))
            for _ in range(self.spec.rollout.group_size)
        ]
        return TrajectoryGroup(uid=sample.uid, trajectories=members)

    async def set_routable(self, urls: list[str]) -> None:
        pass

    async def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def close(self) -> None:
        pass


class _AlwaysDies(_DiesOnce):
    async def run_group(self, sample: Sample) -> TrajectoryGroup:
        os._exit(1)


def _pool(worker_cls: type, **cfg: Any) -> tuple[RolloutWorkerPool, asyncio.AbstractEventLoop]:
    import sys

    from ray import cloudpickle

    # Ray's workers cannot import this test module by name: ship its classes by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    loop = asyncio.new_event_loop()
    spec = WorkerSpec(
        rollout=CollectorConfig(group_size=3),
        reward=RewardConfig(),
        modules=[],
        template_path="unused",
        urls=[],
        run_seed=0,
    )
    config = RolloutWorkersConfig(resources={NODE_RESOURCE: 1}, num_cpus=0, **cfg)
    pool = RolloutWorkerPool(config, spec, routable=list, loop=loop, worker_cls=worker_cls)
    return pool, loop


def _sample(i: int, marker: Path) -> Sample:
    return Sample(env_id="x/Y-v0", uid=f"s{i}", extra={"marker": str(marker)})


def test_a_group_whose_worker_dies_runs_again_once(two_nodes: Any, tmp_path: Path) -> None:
    import ray

    pool, loop = _pool(_DiesOnce, num=2, max_restarts=2)
    try:
        head = ray.get_runtime_context().get_node_id()
        assert {p["node_id"] for p in pool.placement} == {two_nodes.node_id} != {head}
        # a cluster started without agentrl's job runtime_env: each actor brings its own
        for p in pool.placement:
            assert process_env(p["pid"]) | MULTICAST_OFF == process_env(p["pid"])
        marker = tmp_path / "died"
        seen: list[str] = []
        samples = [_sample(i, marker) for i in range(4)]
        groups = loop.run_until_complete(
            pool.collect_ordered(samples, on_group=lambda g: seen.append(g.uid))
        )
        assert [g.uid for g in groups] == ["s0", "s1", "s2", "s3"]  # sample order, all there
        assert sorted(seen) == ["s0", "s1", "s2", "s3"]  # each reported once
        assert all(len(g.trajectories) == 3 for g in groups)
        assert all(t.status is RolloutStatus.COMPLETED for g in groups for t in g.trajectories)
        dead_pid = int(marker.read_text())
        assert all(t.reward != dead_pid for g in groups for t in g.trajectories)
        # every group in flight on the dying worker ran again (one or more, by timing)
        assert pool.retried >= 1 and pool.failed == 0
    finally:
        pool.close()
        loop.close()


def test_a_group_whose_worker_always_dies_comes_back_aborted(
    two_nodes: Any, tmp_path: Path
) -> None:
    pool, loop = _pool(_AlwaysDies, num=1, max_restarts=3, max_retries=1)
    try:
        (group,) = loop.run_until_complete(pool.collect_ordered([_sample(0, tmp_path / "m")]))
        assert group.uid == "s0" and len(group.trajectories) == 3
        assert all(t.status is RolloutStatus.ABORTED for t in group.trajectories)
        assert all(
            "rollout worker died on every attempt" in (t.error or "") for t in group.trajectories
        )
        assert pool.metrics()["rollout_workers/failed_groups"] == 1.0
    finally:
        pool.close()
        loop.close()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num", -1, "rollout_workers.num must be >= 0"),
        ("resources", {"rollout": 0}, "Ray resource name to an amount > 0"),
        ("max_retries", -2, "rollout_workers.max_retries must be >= 0"),
        ("routing_interval_s", 0.0, "routing_interval_s must be > 0"),
    ],
)
def test_bad_settings_are_config_errors(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RolloutWorkersConfig(**{field: value}).validate()


# ---------------------------------------------------------------------- the real path

SHORT = [*ASYNC_SHORT, "train.steps=3"]  # the async-modes test's settings, 3 steps
ON_NODE = [
    "rollout_workers.num=2",
    "rollout_workers.num_cpus=0",
    f"rollout_workers.resources={{{NODE_RESOURCE}: 1}}",
]


def _common(row: dict[str, Any]) -> dict[str, Any]:
    """The deterministic metrics both modes log (not the workers', async's or interrupts')."""
    mine = ("rollout_workers/", "async/", "inference/resumed")
    return {k: v for k, v in deterministic(row).items() if not k.startswith(mine)}


def _train(tmp_path: Path, name: str, *extra: str) -> tuple[list[dict[str, Any]], Any]:
    cfg = smoke_config(tmp_path, *SHORT, f"name={name}", *extra)
    trainer = Trainer(cfg)
    placement: list[Any] = []
    setup = trainer.setup

    def record() -> None:
        setup()
        if trainer.workers is not None:
            placement.extend(trainer.workers.placement)

    trainer.setup = record  # type: ignore[method-assign]
    trainer.run()
    return read_jsonl(cfg.run_dir / "metrics.jsonl"), placement


@pytest.mark.slow
def test_workers_on_a_second_node_train_what_the_driver_trains(
    two_nodes: Any, tmp_path: Path
) -> None:
    """``sync`` on the driver against ``async`` with ``max_staleness=0`` (which trains exactly
    what ``sync`` trains), its rollouts in two workers on the second node and
    ``inference.interrupt: abort`` (the workers' clients are told of every sync): the same
    losses, rewards and token counts, step for step."""
    import ray

    local, none = _train(tmp_path, "local")
    remote, placement = _train(
        tmp_path,
        "remote",
        "train.mode=async",
        "train.max_staleness=0",
        "inference.interrupt=abort",
        *ON_NODE,
    )
    assert none == []
    head = ray.get_runtime_context().get_node_id()
    assert len(placement) == 2 and {p["node_id"] for p in placement} == {two_nodes.node_id}
    assert two_nodes.node_id != head
    assert [r["step"] for r in remote] == [1, 2, 3]
    assert [r["train/data_cursor"] for r in remote] == [2.0, 4.0, 6.0]  # every sample, once
    assert any(r["train/pg_loss"] != 0 for r in local)
    for a, b in zip(local, remote, strict=True):
        assert b["rollout_workers/alive"] == 2.0 and b["rollout_workers/failed_groups"] == 0.0
        assert b["rollout_workers/resumed_requests"] >= 0  # every worker answered the hooks
        assert b["async/staleness_max"] == 0.0
        assert _common(b) == pytest.approx(_common(a), rel=1e-5, abs=1e-6)


async def test_a_worker_request_waits_for_the_driver_to_route_to_a_server(
    tmp_path: Path,
) -> None:
    """Every server a worker routes to failed: its request waits until the driver's routing
    (``set_routable``) names a server again, then goes there, as on the driver's own client."""
    from agentrl.inference.launch import ServerProcess
    from agentrl.inference.protocol import SamplingParams
    from agentrl.sockets import listen_socket
    from agentrl.tiny import make_tiny_model
    from trainers.rollout_workers import RolloutWorker

    model = make_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1)
    dead = listen_socket("127.0.0.1", 0)  # a port nothing answers on once closed
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    cfg = ServerProcess.Config(model=str(model), log_path=str(tmp_path / "s.log"), num_threads=1)
    with ServerProcess(cfg) as live:
        spec = WorkerSpec(
            rollout=CollectorConfig(group_size=1),
            reward=RewardConfig(),
            modules=[],
            template_path=str(model),
            urls=[dead_url, live.url],
            run_seed=0,
            rejoin_wait_s=30.0,
        )
        worker = RolloutWorker(spec)
        try:
            await worker.set_routable([dead_url])  # the driver has not admitted `live` yet
            sp = SamplingParams(max_new_tokens=3, temperature=0)
            task = asyncio.create_task(worker.client.generate([5, 6], sp))
            await asyncio.sleep(1.0)
            assert not task.done()  # the dead server failed; the request waits
            await worker.set_routable([live.url])  # the driver routes to a server again
            done = await asyncio.wait_for(task, 30)
            assert done.server == live.url and len(done.output_ids) == 3
        finally:
            await worker.close()
