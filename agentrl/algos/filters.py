"""Sample filters and reward shaping from DAPO: dynamic sampling and overlong handling.

    scores (B,), group_ids (B,) --nonuniform_groups--> keep (B,) bool
    groups of each generation round --DynamicSampler.add(items, keep)--> .take() when full
    truncated (B,) --overlong_filter_mask--> loss mask without truncated samples
    lengths (B,) --overlong_penalty--> soft length penalty (B,) added to the reward

A group whose rewards are all equal has zero advantage under every group estimator, so it
adds no gradient but does dilute the batch; DAPO drops such groups and keeps generating until
the batch holds enough informative ones. :class:`DynamicSampler` is that accumulator; it holds
any item type (a ``TrajectoryGroup``, an index), and the caller decides what one round is.

Deliberate departure: items beyond the target are dropped by ``take()`` (as in DAPO) unless
``keep_overflow=True``, which carries them to the next batch (slightly off-policy).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor

from agentrl.algos.ops import group_min_max
from agentrl.errors import ConfigError, TrainingError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def nonuniform_groups(scores: Tensor, group_ids: Tensor, *, atol: float = 0.0) -> Tensor:
    """(B,) bool: True for samples whose group has max(score) - min(score) > atol."""
    lo, hi = group_min_max(scores, group_ids)
    return (hi - lo) > atol


def group_has_signal(rewards_G_N: Sequence[Sequence[float]], *, atol: float = 0.0) -> list[bool]:
    """Per group: True if its rewards are not all equal (within atol)."""
    return [bool(r) and (max(r) - min(r)) > atol for r in rewards_G_N]


@dataclass(kw_only=True)
class DynamicSampler(Generic[T]):
    """Accumulate kept items over generation rounds until ``target`` are collected.

    sampler = DynamicSampler[TrajectoryGroup](target=32, max_rounds=4)
    while not sampler.full:
        groups = generate_round()
        sampler.add(groups, group_has_signal([g.rewards_G for g in groups]))
    batch = sampler.take()
    """

    target: int
    """Number of items (usually groups) a training batch needs."""
    max_rounds: int = 0
    """Raise after this many rounds without filling the batch; 0 means no limit."""
    max_rounds_key: str = "max_rounds"
    """The config key that sets ``max_rounds``, named in the error (e.g. algo.max_filter_rounds)."""
    group_size_key: str = "the group size"
    """The config key of the group size, named in the error (e.g. rollout.group_size)."""
    keep_overflow: bool = False
    """Carry items beyond ``target`` to the next batch instead of dropping them."""
    rounds: int = field(default=0, init=False)
    """Rounds added since the last take()."""
    seen: int = field(default=0, init=False)
    """Items seen since the last take()."""
    _kept: list[T] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ConfigError(f"DynamicSampler.target must be > 0, got {self.target}")

    @property
    def full(self) -> bool:
        return len(self._kept) >= self.target

    @property
    def num_kept(self) -> int:
        return len(self._kept)

    def add(self, items: Sequence[T], keep: Sequence[bool] | Tensor) -> None:
        """Add one round of items; keep those whose ``keep`` flag is true."""
        flags = keep.tolist() if isinstance(keep, Tensor) else list(keep)
        if len(flags) != len(items):
            raise ConfigError(f"add() got {len(items)} items but {len(flags)} keep flags")
        self.rounds += 1
        self.seen += len(items)
        self._kept.extend(item for item, k in zip(items, flags, strict=True) if k)
        logger.debug(
            "dynamic sampling round %d: kept %d/%d", self.rounds, self.num_kept, self.target
        )
        if self.max_rounds and self.rounds >= self.max_rounds and not self.full:
            raise TrainingError(
                f"dynamic sampling kept {self.num_kept} of {self.target} items after {self.rounds} "
                f"rounds ({self.seen} seen); most groups have identical rewards. Raise "
                f"{self.max_rounds_key} (now {self.max_rounds}), raise {self.group_size_key}, "
                "or make the task easier/harder."
            )

    def take(self) -> list[T]:
        """The first ``target`` kept items; resets the round counters."""
        if not self.full:
            raise TrainingError(
                f"take() called with {self.num_kept} of {self.target} items; check .full"
            )
        out, rest = self._kept[: self.target], self._kept[self.target :]
        self._kept = rest if self.keep_overflow else []
        self.rounds = self.seen = 0
        return out

    def drain(self) -> list[T]:
        """Every kept item (fewer than ``target`` when not full); resets the sampler."""
        out, self._kept = self._kept, []
        self.rounds = self.seen = 0
        return out


def overlong_filter_mask(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """The loss mask (B, T) with every token of truncated samples (truncated (B,) bool) zeroed."""
    if truncated.shape != response_mask.shape[:1]:
        raise ConfigError(
            f"truncated must be (B,) = ({response_mask.shape[0]},), got {tuple(truncated.shape)}"
        )
    return response_mask * (~truncated.bool()).to(response_mask.dtype)[:, None]


def overlong_penalty(
    lengths: Tensor, *, max_len: int, cache_len: int, factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment (B,), to add to the reward:

    0                                     if L <= max_len - cache_len
    factor * (max_len - cache_len - L) / cache_len   if max_len - cache_len < L <= max_len
    -factor                               if L > max_len
    """
    if not 0 < cache_len <= max_len:
        raise ConfigError(
            f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}"
        )
    expected = max_len - cache_len
    pen = ((expected - lengths.to(torch.float32)) / cache_len).clamp(-1.0, 0.0)
    return pen * factor
