"""A 2-rank WorkerGroup on real Ray: dispatch modes, gloo rendezvous, futures, object refs."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from distributed_workers import Chunk, EchoWorker

from agentrl.distributed import Dispatch, ResourcePool, Sharded, WorkerGroup
from agentrl.errors import ConfigError, TrainingError
from tests.conftest import process_env


@pytest.fixture(scope="module")
def group(ray_local: None) -> Iterator[WorkerGroup[EchoWorker]]:
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2, cpus_per_bundle=0.5))
    wg = WorkerGroup(pool, EchoWorker, kwargs={"offset": 10})
    yield wg
    wg.shutdown()


def test_ranks_get_torch_distributed_env(group: WorkerGroup[EchoWorker]) -> None:
    info = group.whoami()
    assert [i["rank"] for i in info] == [0, 1]
    assert [i["env_rank"] for i in info] == ["0", "1"]
    assert {i["master_addr"] for i in info} == {"127.0.0.1"}
    assert len({i["master_port"] for i in info}) == 1
    assert {i["backend"] for i in info} == {"gloo"}
    assert len({i["pid"] for i in info}) == 2


def test_gloo_all_reduce_across_ranks(group: WorkerGroup[EchoWorker]) -> None:
    # rank r contributes 1 + r: 1 + 2 = 3 on every rank
    assert group.all_reduce_sum(1.0) == [3.0, 3.0]


def test_one_to_all_broadcasts_args_and_kwargs(group: WorkerGroup[EchoWorker]) -> None:
    assert group.add(1, scale=2) == [22, 24]
    assert group.call(EchoWorker.add, 1) == [11, 12]


def test_dp_split_list_goes_rank_by_rank(group: WorkerGroup[EchoWorker]) -> None:
    out = group.shard_of([1, 2, 3, 4, 5], tag="x")
    assert out == [(0, [1, 2, 3], "x"), (1, [4, 5], "x")]


def test_dp_split_splittable_object(group: WorkerGroup[EchoWorker]) -> None:
    assert group.call(EchoWorker.double, Chunk([1, 2, 3])) == Chunk([2, 4, 6])


def test_dp_split_without_anything_to_split_is_refused(group: WorkerGroup[EchoWorker]) -> None:
    with pytest.raises(ConfigError, match="nothing to split"):
        group.double(5)


def test_rank0_runs_everywhere_returns_rank_zero(group: WorkerGroup[EchoWorker]) -> None:
    rank, pid = group.call(EchoWorker.rank_and_pid)
    assert rank == 0 and pid == group.infos[0].pid


def test_all_to_all_one_item_per_rank(group: WorkerGroup[EchoWorker]) -> None:
    assert group.scaled([1, 2], factor=[3, 4]) == [3, 8]
    with pytest.raises(ConfigError, match="one item per rank"):
        group.scaled([1, 2, 3], factor=[1, 1, 1])


def test_submit_returns_futures_that_can_overlap(group: WorkerGroup[EchoWorker]) -> None:
    a = group.submit(EchoWorker.add, 1)
    b = group.double.submit(Chunk([5, 6]))
    assert len(a.refs) == 2 and all(isinstance(r, ray.ObjectRef) for r in a.refs)
    assert b.result() == Chunk([10, 12])
    assert a.result() == [11, 12]
    assert a.done()


def test_sharded_results_flow_between_calls_without_the_driver(
    group: WorkerGroup[EchoWorker], tmp_path: Path
) -> None:
    log = tmp_path / "unpickled.txt"
    log.touch()
    made = group.submit(EchoWorker.make_tracked, [1, 2, 3, 4], str(log)).sharded()
    assert isinstance(made, Sharded) and len(made) == 2
    sums = group.sum_tracked(made)  # each rank reads its own shard from the object store
    assert sums == [30, 70]
    pids = {int(p) for p in log.read_text().split()}
    assert os.getpid() not in pids  # the driver never deserialised a shard
    assert pids == {i.pid for i in group.infos}
    assert made.gather().values == [10, 20, 30, 40]
    assert os.getpid() in {int(p) for p in log.read_text().split()}


def test_sharded_put_from_the_driver(group: WorkerGroup[EchoWorker]) -> None:
    shards = Sharded.put(Chunk([1, 2, 3]), 2)
    assert group.double(shards) == Chunk([2, 4, 6])
    with pytest.raises(ConfigError, match="3 shards for 2 ranks"):
        group.double(Sharded.put([1, 2, 3], 3))


def test_unknown_and_undecorated_methods_explain(group: WorkerGroup[EchoWorker]) -> None:
    with pytest.raises(AttributeError, match="Did you mean 'double'"):
        group.doubel  # noqa: B018
    with pytest.raises(AttributeError, match="decorate it with @dispatch"):
        group.not_exposed  # noqa: B018
    assert group.methods()["shard_of"] is Dispatch.DP_SPLIT


def test_exception_in_a_method_names_the_rank(group: WorkerGroup[EchoWorker]) -> None:
    with pytest.raises(TrainingError, match=r"rank 1 of .*EchoWorker\.fail_on.*ValueError: boom"):
        group.fail_on(1)
    assert group.add(0) == [10, 11]  # the group is still usable


def test_health_answers_while_a_method_runs(group: WorkerGroup[EchoWorker], tmp_path: Path) -> None:
    flag = tmp_path / "go"
    busy = group.submit(EchoWorker.wait_for_file, str(flag))
    infos = group.health(timeout_s=30)
    assert [i.pid for i in infos] == [i.pid for i in group.infos]
    assert not busy.done()
    flag.touch()
    assert busy.result() == [True, True]


def test_actors_get_a_runtime_env_only_where_they_would_not_inherit_one(
    group: WorkerGroup[EchoWorker],
) -> None:
    """On the one-node instance init_ray_local started, workers inherit the driver's
    environment: no runtime_env (it would keep Ray from using its prestarted workers). A
    caller's own runtime_env still gets MULTICAST_OFF; a cluster started elsewhere gets it
    with every actor (tests/trainers/test_rollout_workers.py reads it back there)."""
    from agentrl.distributed.ray_utils import worker_runtime_env
    from agentrl.gpu_env import MULTICAST_OFF

    assert worker_runtime_env() == {}
    env = worker_runtime_env({"env_vars": {"EXTRA": "1"}})
    assert env["env_vars"] == {"EXTRA": "1", **MULTICAST_OFF}


def test_ranks_have_nvlink_multicast_off(group: WorkerGroup[EchoWorker]) -> None:
    """Every rank's process environment holds ``agentrl.gpu_env.MULTICAST_OFF`` (issue 27)."""
    from agentrl.gpu_env import MULTICAST_OFF

    for info in group.whoami():
        env = process_env(info["pid"])
        assert {k: env.get(k) for k in MULTICAST_OFF} == MULTICAST_OFF
