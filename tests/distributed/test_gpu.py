"""GPU bundles: NCCL rendezvous and colocated groups sharing GPUs (needs 2 CUDA GPUs)."""

import pytest
import ray
from distributed_workers import EchoWorker

from agentrl.distributed import ResourcePool, WorkerGroup

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu_pool(ray_local: None) -> ResourcePool:
    if ray.cluster_resources().get("GPU", 0) < 2:
        pytest.skip("needs 2 GPUs visible to Ray")
    return ResourcePool(
        ResourcePool.Config(bundles_per_node=2, gpus_per_bundle=1, cpus_per_bundle=1)
    )


def test_gpu_groups_use_nccl_and_share_gpus(gpu_pool: ResourcePool) -> None:
    actor = WorkerGroup(gpu_pool, EchoWorker, share=0.5, name="actor")
    ref = WorkerGroup(gpu_pool, EchoWorker, share=0.5, name="ref")
    try:
        a, r = actor.whoami(), ref.whoami()
        assert {i["backend"] for i in a + r} == {"nccl"}
        assert [i["resources"]["GPU"] for i in a] == [0.5, 0.5]
        assert actor.all_reduce_sum(1.0) == [3.0, 3.0]
        assert ref.all_reduce_sum(1.0) == [3.0, 3.0]
        # colocated ranks share a GPU: rank i of both groups sits on the same device
        assert [i.gpu_ids for i in actor.infos] == [i.gpu_ids for i in ref.infos]
    finally:
        actor.shutdown()
        ref.shutdown()
