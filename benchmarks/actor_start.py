"""How long a Ray actor takes to start on the one-node instance ``init_ray_local`` starts, with
and without a ``runtime_env``.

    python benchmarks/actor_start.py [--actors 6]

Two variants, each in a fresh process with its own Ray instance; each starts ``--actors``
trivial actors one after the other and times each from ``.remote()`` to its first answer:

- ``runtime_env`` (the baseline, agentrl before 2026-12-07): the job and every actor carry
  ``agentrl.gpu_env.actor_runtime_env()`` (NVLink multicast off), so Ray starts a new worker
  process for every actor;
- ``inherited`` (agentrl now, ``ray_utils.worker_runtime_env``): no runtime_env; the workers
  inherit the variables from the driver, and Ray may hand an actor one of its prestarted
  workers.

The actors import nothing: this measures getting a worker, not a training rank's own imports
(torch and transformers, ~12 s on 2 cores, the same in both). Ends with one JSON line
``{benchmark, baseline, ours, ratio, goal, met}``: the median start, baseline / ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("runtime_env", "inherited")
GOAL = 1.5


def measure(variant: str, actors: int) -> list[float]:
    """Start ``actors`` actors in this process's new Ray instance; each one's start in s."""
    import ray

    from agentrl.distributed.ray_utils import (
        LOOPBACK,
        init_ray_local,
        single_machine_mode,
        worker_runtime_env,
    )
    from agentrl.gpu_env import MULTICAST_OFF, actor_runtime_env, apply_to_this_process

    if variant == "runtime_env":  # init_ray_local as it was: a job runtime_env
        with single_machine_mode():
            apply_to_this_process()
            ray.init(
                runtime_env=actor_runtime_env(),
                address="local",
                _node_ip_address=LOOPBACK,
                include_dashboard=False,
                num_cpus=2,
                logging_level=logging.WARNING,
            )
        options = {"runtime_env": actor_runtime_env()}
    else:
        init_ray_local(num_cpus=2)
        env = worker_runtime_env()
        options = {"runtime_env": env} if env else {}

    @ray.remote(num_cpus=0)
    class Probe:
        def env(self) -> dict[str, str | None]:
            return {k: os.environ.get(k) for k in MULTICAST_OFF}

    starts = []
    try:
        for _ in range(actors):
            t0 = time.perf_counter()
            probe = Probe.options(**options).remote()  # type: ignore[attr-defined]
            seen = ray.get(probe.env.remote(), timeout=120)
            starts.append(time.perf_counter() - t0)
            if seen != MULTICAST_OFF:  # both variants must deliver the variables
                raise SystemExit(f"{variant}: the actor's environment has {seen}")
            ray.kill(probe)
    finally:
        ray.shutdown()
    return starts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, default=6, help="actors started per variant")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's
    a = p.parse_args()
    if a.actors < 1:
        p.error("--actors must be >= 1")
    if a.variant:  # a child: one variant, its starts as JSON
        print(json.dumps(measure(a.variant, a.actors)))
        return
    medians = {}
    for variant in VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--variant", variant, "--actors", str(a.actors)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            },
        )
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
        starts = json.loads(out.stdout.strip().splitlines()[-1])
        medians[variant] = statistics.median(starts)
        print(
            f"{variant}: starts {', '.join(f'{s:.2f}' for s in starts)} s; median {medians[variant]:.2f} s"
        )
    base, ours = medians["runtime_env"], medians["inherited"]
    ratio = base / ours if ours > 0 else None
    print(
        json.dumps(
            {
                "benchmark": f"Ray actor start on the local instance, median of {a.actors}",
                "baseline": f"a runtime_env on the job and every actor: {base:.2f} s",
                "ours": round(ours, 3),
                "ratio": round(ratio, 2) if ratio else None,
                "goal": GOAL,
                "met": bool(ratio and ratio >= GOAL),
            }
        )
    )


if __name__ == "__main__":
    main()
