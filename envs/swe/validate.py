"""Check tasks the way training will use them: grade the base and the gold patch in sandboxes.

    results = await validate_tasks(tasks, repos_dir="/var/tmp/swe", workers=2)
    [r.ok for r in results]      # base (empty patch) not resolved, gold patch resolved

Each task's base commit is made in its prepared repo first when it is missing
(``envs.swe.synth.materialize``); then ``envs.swe.grade.grade`` runs twice in fresh local
sandboxes, with the repo's test env shown read-only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.swe.grade import GradingError, RepoEnv, grade
from envs.swe.synth import materialize
from envs.swe.task import SWETask


@dataclass(frozen=True, slots=True)
class Check:
    """What validating one task found."""

    instance_id: str
    base_resolved: bool
    gold_resolved: bool
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and not self.base_resolved and self.gold_resolved


def repo_env(repos_dir: str | Path, repo: str) -> RepoEnv:
    """The ``RepoEnv`` of a repo ``agentrl swe prepare`` made under ``repos_dir``."""
    root = Path(repos_dir).absolute() / repo.replace("/", "__")
    env = root / "env"
    return RepoEnv(
        repo_dir=str(root / "repo"), python=str(env / "bin" / "python"), ro_paths=(str(env),)
    )


def sample(tasks: Sequence[SWETask], n: int | None, seed: int) -> list[SWETask]:
    """``n`` tasks drawn with ``seed`` (all of them, in order, when ``n`` is None or larger)."""
    if n is None or n >= len(tasks):
        return list(tasks)
    return random.Random(seed).sample(list(tasks), n)


async def validate_tasks(
    tasks: Sequence[SWETask],
    repos_dir: str | Path,
    *,
    workers: int = 2,
    timeout_s: float = 120.0,
    log: Callable[[Check], None] | None = None,
) -> list[Check]:
    """Grade each task's base and gold patch (``workers`` at a time); see the module doc."""
    materialize(tasks, repos_dir, log=print)
    sem = asyncio.Semaphore(max(1, workers))

    async def one(t: SWETask) -> Check:
        async with sem:
            t0 = time.perf_counter()
            env = repo_env(repos_dir, t.repo)
            try:
                base = await grade(t, "", env, timeout_s=timeout_s)
                gold = await grade(t, t.patch, env, timeout_s=timeout_s)
                why = "" if gold.resolved else gold.log_tail[-300:]
                c = Check(
                    t.instance_id, base.resolved, gold.resolved, time.perf_counter() - t0, why
                )
            except GradingError as e:
                c = Check(t.instance_id, False, False, time.perf_counter() - t0, str(e)[:300])
            if log is not None:
                log(c)
            return c

    return list(await asyncio.gather(*(one(t) for t in tasks)))
