"""How long SWE tool calls take and how many an episode makes: the shapes the async benchmark's
workload (bench/LongTail-v0) is fitted to.

    python scripts/swe_rollout_stats.py --tasks data/swe/tasks.jsonl \
        --repos-dir /var/tmp/agentrl-swe [--n 40] [--mode tools|bash] [--json OUT]

Plays the oracle of ``--n`` tasks (seeds 0..n-1) through ``swe/Repo-v0`` on the local sandbox
backend, one episode at a time so that no call waits for another: ``SWEEnv.ademonstration``
gives the calls a solving agent makes (run the failing tests' files, edit, submit) and each is
sent to the episode's own sandbox with ``env.astep``, timed. Reported: the seconds per tool call
(every step but the last), the grading that follows submit, and the tool calls per episode,
each as p50 / p90 / p99 / max, plus the lognormal that matches each p50 and p90 (the way
``envs/longtail.py`` takes its shapes) and the p99 that lognormal predicts, to compare with the
measured one. The repositories come from ``agentrl swe prepare`` (docs/guides/swe.md).

These are the oracle's episodes: its calls are the ones a successful agent makes, so the
latencies are those of real commands in real sandboxes, but its turn counts are the shortest
path (a learning policy takes more). ``--json OUT`` writes the figures for the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.longtail import lognormal_p99, lognormal_sigma  # noqa: E402
from envs.swe.env import SWEEnv  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def shape(xs: list[float]) -> dict[str, float]:
    p50, p90 = pct(xs, 0.5), pct(xs, 0.9)
    out = {"n": len(xs), "p50": p50, "p90": p90, "p99": pct(xs, 0.99), "max": max(xs)}
    out["mean"] = statistics.fmean(xs)
    if 0 < p50 < p90:  # a lognormal through p50 and p90, as envs/longtail.py draws them
        out["lognormal_sigma"] = lognormal_sigma(p50, p90)
        out["lognormal_p99"] = lognormal_p99(p50, p90)
    return out


async def episode(env: SWEEnv, seed: int) -> tuple[list[float], float, int]:
    """(seconds per tool call, seconds of grading, tool calls) of one oracle episode."""
    await env.areset(seed=seed)
    demo = await env.ademonstration()
    if not demo:
        raise RuntimeError(f"seed {seed}: task {env.task} has no demonstration")
    calls: list[float] = []
    grade = 0.0
    for msg in (m for m in demo if m.role == "assistant"):
        start = time.perf_counter()
        _, reward, terminated, _, _ = await env.astep(msg)
        elapsed = time.perf_counter() - start
        if terminated:
            grade = elapsed
            if reward != 1.0:
                raise RuntimeError(f"seed {seed}: the oracle scored {reward} on {env.task}")
            break
        calls.append(elapsed)
    return calls, grade, len(calls)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="swe_stats_") as tmp:
        env = SWEEnv(
            str(args.tasks),
            repos_dir=str(args.repos_dir),
            mode=args.mode,
            workspace_cache=str(Path(tmp) / "workspaces"),
        )
        calls: list[float] = []
        grades: list[float] = []
        turns: list[float] = []
        try:
            for seed in range(args.n):
                c, g, n = await episode(env, seed)
                calls += c
                grades.append(g)
                turns.append(float(n))
                print(
                    f"seed {seed}: {n} calls, {' '.join(f'{x:.2f}' for x in c)} s; grade {g:.2f} s",
                    flush=True,
                )
        finally:
            await env.aclose()
    return {
        "tasks": str(args.tasks),
        "mode": args.mode,
        "episodes": args.n,
        "call_s": shape(calls),
        "grade_s": shape(grades),
        "calls_per_episode": shape(turns),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, default=ROOT / "data" / "swe" / "tasks.jsonl")
    p.add_argument("--repos-dir", type=Path, default=Path("/var/tmp/agentrl-swe"))
    p.add_argument("--n", type=int, default=40, help="episodes (seeds 0..n-1)")
    p.add_argument("--mode", choices=["tools", "bash"], default="tools")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    if args.n < 1:
        p.error("--n must be >= 1")
    if not args.repos_dir.is_dir():
        p.error(f"--repos-dir {args.repos_dir} is not a folder: run `agentrl swe prepare` first")
    out = asyncio.run(main_async(args))
    for key in ("call_s", "grade_s", "calls_per_episode"):
        s = out[key]
        line = f"{key:18s} p50 {s['p50']:.3f}  p90 {s['p90']:.3f}  p99 {s['p99']:.3f}  max {s['max']:.3f}"
        if "lognormal_sigma" in s:
            line += f"  lognormal sigma {s['lognormal_sigma']:.2f} (p99 {s['lognormal_p99']:.3f})"
        print(line)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
