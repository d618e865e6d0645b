"""``algo.filter_groups`` (DAPO's dynamic sampling) for one batch, the same in every train.mode.

    batch = GroupFilter(target=n, max_rounds=4)
    missing = batch.add(groups)          # one generation round's groups
    while missing:                       # draw and generate ``missing`` more samples
        missing = batch.add(generate(missing))
    groups, metrics = batch.result()     # rollout/filter_kept_rate, rollout/filter_padded_groups

Groups whose rewards are all equal carry no GRPO signal and are dropped. When ``max_rounds``
rounds do not find ``target`` groups with signal, groups with identical rewards fill the batch
(under GRPO they carry zero advantage, so the step trains on the signal it found) and a
warning says so: a hard task early in a run must not end it. ``max_rounds`` 0 is no limit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agentrl.algos import DynamicSampler, group_has_signal
from agentrl.types import TrajectoryGroup

logger = logging.getLogger(__name__)

KEPT_RATE = "rollout/filter_kept_rate"
PADDED_GROUPS = "rollout/filter_padded_groups"


class GroupFilter:
    """One batch's rounds of groups in, the batch and its filter metrics out."""

    def __init__(self, *, target: int, max_rounds: int) -> None:
        self.target, self.max_rounds = target, max_rounds
        self._sampler = DynamicSampler[TrajectoryGroup](target=target)
        self._flat: list[TrajectoryGroup] = []  # dropped for identical rewards: the padding
        self._result: tuple[list[TrajectoryGroup], dict[str, float]] | None = None

    def add(self, groups: Sequence[TrajectoryGroup]) -> int:
        """Take one round's groups; return how many more to generate (0: the batch is ready)."""
        if self._result is not None:
            raise RuntimeError("GroupFilter.add() after the batch was complete")
        keep = group_has_signal([g.rewards_G for g in groups])
        self._sampler.add(groups, keep)
        self._flat += [g for g, k in zip(groups, keep, strict=True) if not k]
        seen, rounds = self._sampler.seen, self._sampler.rounds
        if self._sampler.full:
            self._result = self._sampler.take(), {KEPT_RATE: self.target / seen, PADDED_GROUPS: 0.0}
            return 0
        if self.max_rounds and rounds >= self.max_rounds:
            kept = self._sampler.drain()
            pad = self.target - len(kept)
            logger.warning(
                "dynamic sampling found %d of %d groups with reward signal in %d rounds "
                "(algo.max_filter_rounds=%d); %d groups with identical rewards fill the "
                "batch. If this persists, warm up longer (sft.steps), raise "
                "rollout.group_size or algo.max_filter_rounds.",
                len(kept),
                self.target,
                rounds,
                self.max_rounds,
                pad,
            )
            self._result = (
                kept + self._flat[:pad],
                {
                    KEPT_RATE: len(kept) / seen,
                    PADDED_GROUPS: float(pad),
                },
            )
            return 0
        return self.target - self._sampler.num_kept

    def result(self) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        if self._result is None:
            raise RuntimeError("GroupFilter.result() before add() returned 0")
        return self._result
