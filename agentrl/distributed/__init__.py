"""Single-controller plumbing on Ray: resource pools, worker groups, dispatch modes.

    init_ray_local()
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2))
    group = WorkerGroup(pool, MyWorker)
    result = group.my_dp_method(batch)       # split across ranks, gathered back

See ``worker_group.py`` for the full picture and docs/guides/distributed.md for a guide.
"""

from agentrl.distributed.dispatch import Dispatch, DispatchedMethod, Splittable, dispatch
from agentrl.distributed.futures import GroupFuture, Sharded
from agentrl.distributed.ray_utils import init_ray_local
from agentrl.distributed.resources import PlacementStrategy, ResourcePool
from agentrl.distributed.worker import DataLayout, HostInfo, Worker, WorkerContext
from agentrl.distributed.worker_group import GroupMethod, ShardCache, WorkerGroup

__all__ = [
    "DataLayout",
    "Dispatch",
    "DispatchedMethod",
    "GroupFuture",
    "GroupMethod",
    "HostInfo",
    "PlacementStrategy",
    "ResourcePool",
    "ShardCache",
    "Sharded",
    "Splittable",
    "Worker",
    "WorkerContext",
    "WorkerGroup",
    "dispatch",
    "init_ray_local",
]
