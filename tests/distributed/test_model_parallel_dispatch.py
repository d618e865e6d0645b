"""DP_SPLIT over ranks in model-parallel groups: one shard per group, gathered once per shard."""

import pytest
from distributed_workers import Chunk, ModelParallelWorker

from agentrl.distributed import ResourcePool, WorkerGroup
from agentrl.errors import ConfigError


@pytest.fixture
def pool(ray_local: None):
    p = ResourcePool(ResourcePool.Config(bundles_per_node=4, cpus_per_bundle=0.25))
    yield p
    p.shutdown()


def test_ranks_of_one_group_share_a_shard_and_only_one_is_gathered(pool: ResourcePool) -> None:
    with WorkerGroup(pool, ModelParallelWorker, kwargs={"mp": 2}) as group:
        assert [(lay.dp_rank, lay.collect) for lay in group.layouts] == [
            (0, True),
            (0, False),
            (1, True),
            (1, False),
        ]
        got = group.owned(Chunk(list(range(5))))
        # two shards (3 + 2 values); ranks 0 and 2 answer, ranks 1 and 3 computed but stay silent
        assert got == [(0, [0, 1, 2]), (2, [3, 4])]
        # a sharded result feeds the next DP_SPLIT call shard by shard, to the right groups
        doubled = group.submit(ModelParallelWorker.doubled, Chunk([1, 2, 3])).sharded()
        assert len(doubled) == 2
        assert group.owned(doubled) == [(0, [2, 4]), (2, [6])]


def test_a_layout_without_one_collector_per_shard_is_refused(pool: ResourcePool) -> None:
    with pytest.raises(ConfigError, match="exactly one collecting rank"):
        WorkerGroup(pool, ModelParallelWorker, kwargs={"mp": 2, "bad_layout": True})
