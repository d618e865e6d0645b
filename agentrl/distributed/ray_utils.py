"""Start a local Ray instance on loopback, and describe what a Ray cluster has to offer.

``init_ray_local`` is the one way the driver and the tests start Ray on one machine: no
dashboard, quiet logs, idempotent (a second call reuses the running instance).
"""

from __future__ import annotations

import logging
import os

import ray

logger = logging.getLogger(__name__)

_SHOWN = ("CPU", "GPU", "memory", "object_store_memory")


def init_ray_local(
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
) -> None:
    """Start Ray on this machine (loopback, no dashboard), or reuse the instance already running.

    ``num_cpus`` / ``num_gpus`` default to what Ray detects. When Ray is already initialised the
    arguments are not applied; a debug line says what is running instead.
    """
    if ray.is_initialized():
        logger.debug("ray already running with %s", format_resources(ray.cluster_resources()))
        return
    # Quiet the autoscaler's "no node can fit ..." events: ResourcePool raises its own error.
    os.environ.setdefault("RAY_SCHEDULER_EVENTS", "0")
    ray.init(
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        object_store_memory=object_store_memory,
        logging_level=logging.WARNING,
        configure_logging=True,
        log_to_driver=True,
    )
    logger.info("started local ray: %s", format_resources(ray.cluster_resources()))


def format_resources(resources: dict[str, float]) -> str:
    """``CPU=2, GPU=0, memory=16.0GiB`` for the resources people care about."""
    parts = []
    for key in _SHOWN:
        value = resources.get(key, 0.0)
        if "memory" in key:
            parts.append(f"{key}={value / 2**30:.1f}GiB")
        else:
            parts.append(f"{key}={value:g}")
    return ", ".join(parts)
