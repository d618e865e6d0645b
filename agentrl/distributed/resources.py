"""ResourcePool: a Ray placement group of ``nodes x bundles_per_node`` bundles, one per rank.

    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2))   # 2 x {"CPU": 1}
    actor = WorkerGroup(pool, ActorWorker, share=0.5)               # rank i -> bundle i
    ref = WorkerGroup(pool, RefWorker, share=0.5)                   # colocated on the same bundles

A bundle is ``{"CPU": k}`` on a CPU machine and ``{"GPU": 1, "CPU": k}`` on a GPU machine.
Several WorkerGroups can share one pool (colocation, e.g. actor + reference policy on the same
GPUs): each takes a fraction (``share``) of every bundle, and the pool refuses to hand out more
than the whole. The pool waits for its placement group with a bounded timeout; when Ray cannot
reserve it, the error says what was asked for and what the cluster has.

The placement group goes away with ``shutdown()``, or when the last WorkerGroup on the pool
shuts down.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.distributed.ray_utils import format_resources
from agentrl.errors import ConfigError, ResourceUnavailableError

logger = logging.getLogger(__name__)

_EPS = 1e-9


class PlacementStrategy(StrEnum):
    """Ray's placement-group strategies."""

    PACK = "PACK"  # as few nodes as possible
    SPREAD = "SPREAD"  # across nodes where possible
    STRICT_PACK = "STRICT_PACK"  # all bundles on one node, or fail
    STRICT_SPREAD = "STRICT_SPREAD"  # each bundle on a different node, or fail


class ResourcePool:
    """A placement group whose bundle ``i`` hosts rank ``i`` of every WorkerGroup placed on it."""

    @dataclass(frozen=True, kw_only=True)
    class Config:
        nodes: int = 1
        """Number of machines the pool spans (ranks are ``nodes * bundles_per_node``)."""
        bundles_per_node: int = 1
        """Bundles (ranks) per machine; on GPU machines, one per GPU."""
        cpus_per_bundle: float = 1.0
        """CPUs reserved in each bundle."""
        gpus_per_bundle: float = 0.0
        """GPUs reserved in each bundle: 0 on CPU machines, 1 on GPU machines."""
        strategy: PlacementStrategy = PlacementStrategy.PACK
        """How Ray places the bundles across machines."""
        ready_timeout_s: float = 60.0
        """How long to wait for Ray to reserve the bundles before giving up."""
        name: str = ""
        """Label used in logs and errors (default: a short random id)."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or ResourcePool.Config()
        _validate(self.config)
        self.name = self.config.name or f"pool-{uuid.uuid4().hex[:6]}"
        self._shares: dict[str, float] = {}
        self._pg: PlacementGroup | None = placement_group(
            self.bundles, strategy=str(self.config.strategy), name=self.name
        )
        self._wait_ready()

    @property
    def world_size(self) -> int:
        return self.config.nodes * self.config.bundles_per_node

    @property
    def bundle(self) -> dict[str, float]:
        """The resources of one bundle, as Ray spells them."""
        b = {"CPU": float(self.config.cpus_per_bundle)}
        if self.config.gpus_per_bundle > 0:
            b["GPU"] = float(self.config.gpus_per_bundle)
        return b

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [dict(self.bundle) for _ in range(self.world_size)]

    @property
    def placement_group(self) -> PlacementGroup:
        if self._pg is None:
            raise ConfigError(f"resource pool {self.name!r} was shut down; create a new one.")
        return self._pg

    @property
    def free_share(self) -> float:
        """The fraction of every bundle not yet taken by a WorkerGroup."""
        return max(0.0, 1.0 - sum(self._shares.values()))

    def reserve(self, owner: str, share: float) -> None:
        """Take ``share`` (0 < share <= 1) of every bundle for the WorkerGroup ``owner``."""
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"share must be in (0, 1], got {share} for {owner!r}.")
        if owner in self._shares:
            raise ConfigError(
                f"a WorkerGroup named {owner!r} is already on pool {self.name!r}; give each "
                f"group its own name."
            )
        if share > self.free_share + _EPS:
            taken = ", ".join(f"{k}={v:g}" for k, v in self._shares.items())
            raise ResourceUnavailableError(
                f"{owner!r} asks for share={share:g} of each bundle of pool {self.name!r}, but only "
                f"{self.free_share:g} is free (taken: {taken}). Colocated groups must have shares "
                f"that sum to at most 1, e.g. share=0.5 each for two groups."
            )
        self.placement_group  # noqa: B018 - raises if shut down
        self._shares[owner] = share

    def release(self, owner: str, remove_if_last: bool = True) -> None:
        """Give back ``owner``'s share; the last one out removes the placement group."""
        self._shares.pop(owner, None)
        if remove_if_last and not self._shares:
            self.shutdown()

    def actor_options(self, rank: int, share: float) -> dict[str, Any]:
        """Ray ``.options(...)`` that put an actor in bundle ``rank`` with ``share`` of it."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} outside pool {self.name!r} of {self.world_size}")
        options: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=rank,
                placement_group_capture_child_tasks=True,
            ),
            "num_cpus": self.config.cpus_per_bundle * share,
            "num_gpus": self.config.gpus_per_bundle * share,
        }
        return options

    def shutdown(self) -> None:
        """Remove the placement group (and so every actor still in it). Idempotent."""
        if self._pg is not None and ray.is_initialized():
            remove_placement_group(self._pg)
            logger.debug("removed placement group %s", self.name)
        self._pg = None
        self._shares.clear()

    def __enter__(self) -> ResourcePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ResourcePool({self.name!r}, {c.nodes}x{c.bundles_per_node} x {self.bundle}, "
            f"{c.strategy})"
        )

    def _wait_ready(self) -> None:
        timeout = self.config.ready_timeout_s
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout)
        if ready:
            logger.debug("placement group ready: %r", self)
            return
        self.shutdown()
        total = {k: v * self.world_size for k, v in self.bundle.items()}
        raise ResourceUnavailableError(
            f"resource pool {self.name!r} not ready after {timeout:g}s: requested "
            f"{self.world_size} bundle(s) of {self.bundle} (total {total}, strategy "
            f"{self.config.strategy}); Ray has available now: "
            f"{format_resources(ray.available_resources())}; cluster total: "
            f"{format_resources(ray.cluster_resources())}. Fix: ask for fewer or smaller bundles "
            f"(ResourcePool.Config.bundles_per_node / cpus_per_bundle / gpus_per_bundle), free "
            f"resources held by other pools or actors, or start Ray with more "
            f"(init_ray_local(num_cpus=...))."
        )


def _validate(c: ResourcePool.Config) -> None:
    if c.nodes < 1 or c.bundles_per_node < 1:
        raise ConfigError(
            f"a resource pool needs nodes >= 1 and bundles_per_node >= 1, got "
            f"nodes={c.nodes}, bundles_per_node={c.bundles_per_node}."
        )
    if c.cpus_per_bundle < 0 or c.gpus_per_bundle < 0:
        raise ConfigError(
            f"cpus_per_bundle and gpus_per_bundle must be >= 0, got {c.cpus_per_bundle} and "
            f"{c.gpus_per_bundle}."
        )
    if c.cpus_per_bundle == 0 and c.gpus_per_bundle == 0:
        raise ConfigError("a bundle must reserve some CPU or GPU; set cpus_per_bundle > 0.")
    if c.ready_timeout_s <= 0:
        raise ConfigError(f"ready_timeout_s must be > 0, got {c.ready_timeout_s}.")
    try:
        PlacementStrategy(c.strategy)
    except ValueError:
        names = ", ".join(s.value for s in PlacementStrategy)
        raise ConfigError(
            f"unknown placement strategy {c.strategy!r}; use one of {names}."
        ) from None
