"""Start a local Ray instance on loopback, and describe what a Ray cluster has to offer.

``init_ray_local`` is the one way the driver and the tests start Ray on one machine: no
dashboard, quiet logs, idempotent (a second call reuses the running instance), and every
Ray server (GCS, raylet and object manager, core workers, dashboard and runtime-env agents,
metrics exporters, autoscaler monitor) listening on 127.0.0.1 only.

Why ``_node_ip_address="127.0.0.1"`` alone is not enough: on Linux, ``ray.init`` replaces a
loopback node address with the machine's routable address (``services.resolve_ip_for_localhost``),
and Ray's servers bind the node address, or all interfaces. Ray's single-machine mode, the
default on macOS and Windows, keeps loopback instead; the documented switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` turns it on for Linux too. Ray reads that variable
once, when ``ray`` is imported, so while ``ray.init`` runs we set it both in the environment
(for every Ray process started from here) and in the driver's already-imported copy, and put
both back afterwards: a later ``ray.init(address=...)`` to a real cluster is unaffected.

    init_ray_local(num_cpus=2)
      -> env RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, ray_constants.ENABLE_RAY_CLUSTER=False
      -> ray.init(_node_ip_address="127.0.0.1", ...)   node address stays 127.0.0.1
      -> gcs_server / raylet / workers / agents bind 127.0.0.1
      -> environment and flag restored
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from agentrl.gpu_env import actor_runtime_env, apply_to_this_process

logger = logging.getLogger(__name__)

_SHOWN = ("CPU", "GPU", "memory", "object_store_memory")

LOOPBACK = "127.0.0.1"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch between cluster mode (routable node address) and single-machine mode (loopback)."""


_STARTED_HERE: set[str] = set()
"""GCS addresses of the Ray instances ``init_ray_local`` started in this process."""


def worker_runtime_env(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``runtime_env`` for an actor this process creates: ``actor_runtime_env(extra)``
    (NVLink multicast off, ``agentrl.gpu_env``), or ``{}`` where every worker inherits this
    process's environment already: the one-node instance ``init_ray_local`` started.

    A runtime_env is left out where it is not needed because Ray then cannot give the actor
    one of its prestarted workers: each actor waited for a new worker process, ~2.4 s
    against ~0.6-0.9 s for the first two here (2 cores). A cluster someone else started, or
    one that other nodes have joined, gets the variables with every actor."""
    if not extra and ray.is_initialized():
        here = ray.get_runtime_context().gcs_address in _STARTED_HERE
        if here and sum(1 for n in ray.nodes() if n.get("Alive")) == 1:
            return {}
    return actor_runtime_env(extra)


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
    _quiet_token_auth_notice()
    with single_machine_mode():
        # NVLink multicast off (agentrl.gpu_env) before Ray starts: the raylet, and through it
        # every worker of this instance, inherits this process's environment. No job
        # runtime_env: with one, Ray cannot hand an actor a prestarted worker (see
        # worker_runtime_env).
        apply_to_this_process()
        ray.init(
            # a new instance even when a `ray start` cluster runs on this machine (ray.init()
            # would connect to it, and refuse num_cpus)
            address="local",
            _node_ip_address=LOOPBACK,
            include_dashboard=False,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            object_store_memory=object_store_memory,
            logging_level=logging.WARNING,
            configure_logging=True,
            log_to_driver=True,
        )
    _STARTED_HERE.add(ray.get_runtime_context().gcs_address)
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        logger.warning(
            "ray node address is %s, expected %s: Ray servers may listen beyond loopback",
            node_ip,
            LOOPBACK,
        )
    logger.info("started local ray: %s", format_resources(ray.cluster_resources()))


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


def _quiet_token_auth_notice() -> None:
    """Token authentication is on (Ray's default for a new local cluster, which we keep); drop
    the warning Ray prints about it on every start. Other auth warnings still show."""
    auth = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropTokenAuthNotice) for f in auth.filters):
        auth.addFilter(_DropTokenAuthNotice())


@contextmanager
def single_machine_mode() -> Iterator[None]:
    """Within the block, a Ray started here keeps 127.0.0.1 as its node address.

    Sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` for the processes Ray spawns and the
    driver's copy of the flag (computed when ``ray`` was imported); restores both on exit.
    """
    from ray._private import ray_constants

    saved_env = os.environ.get(SINGLE_MACHINE_ENV)
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = saved_env


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
