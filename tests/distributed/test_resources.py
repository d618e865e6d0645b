"""ResourcePool on real Ray: unmet requests fail clearly and in time; colocated groups share."""

import pytest
import ray
from distributed_workers import EchoWorker

from agentrl.distributed import ResourcePool, WorkerGroup
from agentrl.errors import ConfigError, ResourceUnavailableError


def _states(name: str) -> list[str]:
    table = ray.util.placement_group_table().values()
    return [pg["state"] for pg in table if pg["name"] == name]


def test_request_that_cannot_be_met_says_what_and_why(ray_local: None) -> None:
    config = ResourcePool.Config(
        bundles_per_node=2, cpus_per_bundle=64, ready_timeout_s=1, name="too-big"
    )
    with pytest.raises(ResourceUnavailableError) as err:
        ResourcePool(config)
    msg = str(err.value)
    assert "2 bundle(s) of {'CPU': 64.0}" in msg
    assert "available now: CPU=" in msg and "cluster total: CPU=2" in msg
    assert "init_ray_local(num_cpus=...)" in msg
    assert _states("too-big") == ["REMOVED"]  # the pending request does not linger


def test_gpu_request_on_a_cpu_machine_fails_in_time(ray_local: None) -> None:
    config = ResourcePool.Config(gpus_per_bundle=1, ready_timeout_s=1)
    with pytest.raises(ResourceUnavailableError, match=r"'GPU': 1\.0.*GPU=0"):
        ResourcePool(config)


def test_bad_pool_config_is_a_config_error(ray_local: None) -> None:
    with pytest.raises(ConfigError, match="bundles_per_node >= 1"):
        ResourcePool(ResourcePool.Config(bundles_per_node=0))
    with pytest.raises(ConfigError, match="unknown placement strategy"):
        ResourcePool(ResourcePool.Config(strategy="TIGHT"))  # type: ignore[arg-type]


def test_colocated_groups_share_one_pool(ray_local: None) -> None:
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2, cpus_per_bundle=0.5, name="coloc"))
    quick = {"join_collective": False}  # the gloo rendezvous is covered in test_worker_group
    actor = WorkerGroup(pool, EchoWorker, kwargs=quick, share=0.5, name="actor")
    ref = WorkerGroup(pool, EchoWorker, kwargs={"offset": 100, **quick}, share=0.5, name="ref")
    try:
        with pytest.raises(ConfigError, match="'ref' is already on pool"):
            WorkerGroup(pool, EchoWorker, share=0.1, name="ref")
        with pytest.raises(ResourceUnavailableError, match="only 0 is free"):
            WorkerGroup(pool, EchoWorker, share=0.5, name="critic")
        a, r = actor.whoami(), ref.whoami()
        pg_id = pool.placement_group.id.hex()
        assert {i["placement_group"] for i in a + r} == {pg_id}
        assert [i["resources"] for i in a] == [{"CPU": 0.25}, {"CPU": 0.25}]
        assert a[0]["master_port"] != r[0]["master_port"]  # two separate rendezvous
        assert ref.add(0) == [100, 101]
        actor.shutdown()
        assert ref.add(0) == [100, 101]  # the pool outlives the first group
    finally:
        actor.shutdown()
        ref.shutdown()
    with pytest.raises(ConfigError, match="shut down"):
        pool.placement_group  # noqa: B018 - the last group out removed it
    assert _states("coloc") == ["REMOVED"]
