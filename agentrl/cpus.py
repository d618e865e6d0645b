"""How many CPUs this process may really use.

``os.cpu_count()`` counts the host's CPUs. Under ``taskset``, a cpuset or a container's CPU
quota that overstates what a process gets (16 on a host where a run is pinned to 2 cores), and
thread pools sized from it oversubscribe the cores they do get. ``available_cpus()`` takes the
affinity mask and caps it by a cgroup v2 ``cpu.max`` quota.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus() -> int:
    """CPUs this process can run on (affinity, capped by a cgroup v2 quota); at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, quota)
    return max(1, cpus)


def _cgroup_quota(path: Path | None = None) -> int | None:
    """``cpu.max`` as whole CPUs, rounded up ("150000 100000" -> 2); None when unlimited or absent."""
    try:
        quota, period = (path or _CPU_MAX).read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None
