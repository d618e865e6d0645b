"""Rollouts that fail in the machinery: warn per step, stop the run when it persists.

    guard = FailureGuard(cfg.train, logs_dir)
    guard.check(groups, step)   # every RL step, before the batch is built

Failed rollouts (env errors, non-finite rewards, dead servers, ...) are masked out of the loss,
so a step where most of them failed trains on the few that did not, and a broken env or server
would otherwise let the run go on, learning little or nothing, until its last step. Above
``train.max_error_rate`` a step warns; after ``train.max_failed_steps`` such steps in a row the
run stops with the most common error. The agent's own failures (a bad tool call, a turn limit)
are what RL learns from and never count here.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from agentrl.errors import TrainingError
from agentrl.types import TrajectoryGroup
from trainers.config import TrainConfig

logger = logging.getLogger(__name__)


class FailureGuard:
    """Counts consecutive steps with too many machinery failures (``failed_steps``)."""

    def __init__(self, cfg: TrainConfig, logs_dir: Path) -> None:
        self.max_error_rate = cfg.max_error_rate
        self.max_failed_steps = cfg.max_failed_steps  # 0: warn, never stop
        self.logs_dir = logs_dir
        self.failed_steps = 0

    def check(self, groups: list[TrajectoryGroup], step: int) -> None:
        """Warn when too many of ``step``'s rollouts failed; raise when it persists."""
        trajs = [t for g in groups for t in g.trajectories]
        failed = [t for t in trajs if t.status.is_infra_failure]
        if not trajs or (
            len(failed) / len(trajs) <= self.max_error_rate and len(failed) < len(trajs)
        ):
            self.failed_steps = 0
            return
        self.failed_steps += 1
        errors = Counter(f"{t.status.value}: {t.error or 'no message'}" for t in failed)
        ((top, n),) = errors.most_common(1)
        logger.warning(
            "step %d: %d of %d rollouts failed and are masked out (train.max_error_rate=%s); "
            "most common (%d x): %s",
            step,
            len(failed),
            len(trajs),
            self.max_error_rate,
            n,
            top,
        )
        limit = self.max_failed_steps
        if limit and self.failed_steps >= limit:
            raise TrainingError(
                f"more than train.max_error_rate={self.max_error_rate} of the rollouts failed "
                f"in {self.failed_steps} consecutive steps (train.max_failed_steps={limit}); "
                f"in the last one {len(failed)} of {len(trajs)}, most often ({n}x): {top}. "
                f"Check the env and the server logs in {self.logs_dir}."
            )
