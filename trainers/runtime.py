"""Process-level setup shared by the RL driver, SFT and the CLI: Ray, seeds, threads, signals.

    start_ray(num_cpus) -> seed_everything(seed) -> exit_on_sigterm() -> ResourcePool(pool_config(cfg))

Kept apart from ``trainers.driver`` so SFT (which the driver runs) and the CLI can use it
without importing the driver.
"""

from __future__ import annotations

import logging
import random
import signal
import sys
import threading

import numpy as np
import torch

from agentrl.cpus import available_cpus
from agentrl.distributed import ResourcePool, init_ray_local
from trainers.config import RunConfig
from trainers.serving import resolve_device

logger = logging.getLogger(__name__)


def pool_config(cfg: RunConfig) -> ResourcePool.Config:
    """One bundle per training rank (with a GPU when the engine runs on CUDA)."""
    gpus = 1.0 if resolve_device(cfg.engine.device) == "cuda" else 0.0
    return ResourcePool.Config(bundles_per_node=cfg.train.world_size, gpus_per_bundle=gpus)


def exit_on_sigterm() -> None:
    """SIGTERM (kill, a scheduler) unwinds like Ctrl-C, so ``close()`` stops the servers."""

    def handler(signum: int, frame: object) -> None:
        logger.warning("SIGTERM: stopping the run")
        sys.exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_ray(num_cpus: int, num_gpus: int | None = None) -> bool:
    """Start local Ray unless it runs already; True if this call started it. ``num_gpus``
    (``trainers.plan.Plan.ray_gpus``): the GPUs Ray may hand out, 0 .. num_gpus - 1, so
    servers placed on the others never share a GPU with a training rank."""
    import ray

    if ray.is_initialized():
        return False
    init_ray_local(num_cpus=num_cpus or available_cpus(), num_gpus=num_gpus)
    return True


def threads_per_rank(cfg: RunConfig) -> int:
    """torch threads per training rank: the run's CPUs shared by its ranks."""
    cpus = cfg.train.num_cpus or available_cpus()
    return max(1, cpus // cfg.train.world_size)
