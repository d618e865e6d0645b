"""Failures on real Ray: dead ranks, failing constructors and slow calls never hang the driver."""

import time
from pathlib import Path

import pytest
import ray
from distributed_workers import EchoWorker, FailingInitWorker

from agentrl.distributed import ResourcePool, WorkerGroup
from agentrl.errors import TrainingError, WorkerDiedError, WorkerTimeoutError


def _pool() -> ResourcePool:
    return ResourcePool(ResourcePool.Config(bundles_per_node=2, cpus_per_bundle=0.5))


def _kill(handle: ray.actor.ActorHandle) -> None:
    """ray.kill, then wait (bounded) until the actor is gone: the kill travels through Ray's
    control plane, so a call sent right after it can still run on the live actor."""
    ray.kill(handle)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ping.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers after 30 s")


def test_killed_rank_is_a_worker_died_error(ray_local: None) -> None:
    wg = WorkerGroup(_pool(), EchoWorker, config=WorkerGroup.Config(call_timeout_s=60))
    try:
        assert wg.all_reduce_sum(0.0) == [1.0, 1.0]
        _kill(wg.handles[1])
        # rank 0 joins a collective that rank 1 will never reach: still no hang
        with pytest.raises(WorkerDiedError) as err:
            wg.all_reduce_sum(0.0)
        msg = str(err.value)
        assert "rank 1 of" in msg and "EchoWorker.all_reduce_sum" in msg
        assert "build a new one" in msg and "ray.kill" in msg
        with pytest.raises(WorkerDiedError, match=r"rank 1 of .*EchoWorker\.ping"):
            wg.health(timeout_s=30)
    finally:
        wg.shutdown()


def test_failing_constructor_names_the_rank_and_frees_the_pool(ray_local: None) -> None:
    pool = _pool()
    with pytest.raises(
        TrainingError, match=r"rank 1 of .*FailingInitWorker\.__init__.*cannot build"
    ):
        WorkerGroup(pool, FailingInitWorker, kwargs={"bad_rank": 1})
    assert pool.free_share == 1.0
    wg = WorkerGroup(pool, FailingInitWorker, kwargs={"bad_rank": -1})  # the pool is reusable
    assert wg.ok() == [True, True]
    wg.shutdown()


def test_slow_call_times_out_with_the_ranks_named(ray_local: None, tmp_path: Path) -> None:
    wg = WorkerGroup(_pool(), EchoWorker, kwargs={"join_collective": False})
    flag = tmp_path / "go"
    try:
        busy = wg.submit(EchoWorker.wait_for_file, str(flag))
        with pytest.raises(WorkerTimeoutError, match=r"rank\(s\) \[0, 1\] after 0.5s"):
            busy.result(timeout_s=0.5)
        flag.touch()
        assert busy.result() == [True, True]
    finally:
        wg.shutdown()
