"""Environment every process of a run gets: NVLink multicast (NVLS) off.

    MULTICAST_OFF = {NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1}

On the multi-GPU hosts this project runs on, NVLink multicast must stay off: NCCL's NVLS
collectives, torch's symmetric-memory multicast and NVSHMEM's NVLS each use it when they find
it. Every process that may touch NCCL gets these three variables, whatever its parent set:

- the driver (``apply_to_this_process``, called by ``init_ray_local`` and ``agentrl train``),
  which may broadcast weights to the servers over NCCL;
- every Ray worker: on the one-node instance ``init_ray_local`` starts, by inheritance (the
  driver sets them before ``ray.init``, the raylet and its workers inherit them); on a cluster
  someone else started, or one other nodes joined, through each actor's own ``runtime_env``
  (``ray_utils.worker_runtime_env``: training ranks, rollout workers);
- every inference server process (embedded, vLLM, SGLang: ``server_env``).

``tests/distributed/test_gpu_env.py`` reads them back from a real Ray worker, a rollout
worker and a real server process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

MULTICAST_OFF: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def apply_to_this_process() -> None:
    """Set ``MULTICAST_OFF`` in this process's environment (before NCCL is initialised)."""
    os.environ.update(MULTICAST_OFF)


def server_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """A child process's environment: ours, then ``layers`` in order, then ``MULTICAST_OFF``."""
    env = dict(os.environ)
    for layer in layers:
        env.update(layer)
    env.update(MULTICAST_OFF)
    return env


def actor_runtime_env(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` whose ``env_vars`` hold ``MULTICAST_OFF`` (and ``extra``'s)."""
    env = dict(extra or {})
    env["env_vars"] = {**env.get("env_vars", {}), **MULTICAST_OFF}
    return env
