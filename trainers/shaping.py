"""What the driver does to a collected batch's rewards and masks before the advantages.

    apply_overlong(batch, cfg.algo.overlong)   DAPO: soft length penalty, truncated rows out
    set_greedy_baselines(batch, groups, greedy, cfg.algo.overlong)   ReMax baselines

Each function changes ``batch`` in place (fields ``rewards``, ``token_rewards``,
``loss_mask``, ``sample_mask``) and returns the metrics that say what it did.
"""

from __future__ import annotations

import torch

from agentrl.algos import overlong_filter_mask, overlong_penalty
from agentrl.algos.ops import scatter_to_last_token
from agentrl.batch import TrainBatch
from agentrl.types import RolloutStatus, TrajectoryGroup
from trainers.config import OverlongConfig


def apply_overlong(batch: TrainBatch, ol: OverlongConfig) -> dict[str, float]:
    """DAPO overlong handling: the soft length penalty into the rewards (by the generated
    tokens of each row's trajectory), then rows that ran out of tokens out of the loss."""
    out: dict[str, float] = {}
    if ol.penalty:
        lengths = trajectory_lengths(batch)
        pen = overlong_penalty(
            lengths, max_len=ol.max_len, cache_len=ol.cache_len, factor=ol.penalty_factor
        )
        batch["rewards"] = batch.rewards + pen
        batch["token_rewards"] = batch.token_rewards + scatter_to_last_token(pen, batch.loss_mask)
        rows = batch.sample_mask.bool()
        out["train/overlong_penalty_mean"] = float(pen[rows].mean()) if rows.any() else 0.0
    if ol.filter:
        truncated = torch.tensor([r.status is RolloutStatus.TRUNCATED_LENGTH for r in batch.rows])
        batch["loss_mask"] = overlong_filter_mask(batch.loss_mask, truncated)
        batch["sample_mask"] = batch.sample_mask * (~truncated).to(batch.sample_mask.dtype)
        out["train/overlong_filtered_rate"] = float(truncated.float().mean())
    return out


def length_penalty(lengths: torch.Tensor, ol: OverlongConfig) -> torch.Tensor:
    """(B,) penalty for generated-token counts (B,); zeros without ``algo.overlong.penalty``."""
    if not ol.penalty:
        return torch.zeros(lengths.shape)
    return overlong_penalty(
        lengths, max_len=ol.max_len, cache_len=ol.cache_len, factor=ol.penalty_factor
    )


def trajectory_lengths(batch: TrainBatch) -> torch.Tensor:
    """(B,) generated tokens of each row's whole trajectory (its rows are its segments)."""
    index: dict[str, int] = {}
    traj = torch.tensor([index.setdefault(r.trajectory_id, len(index)) for r in batch.rows])
    per_row = batch.loss_mask.sum(-1)
    per_traj = torch.zeros(len(index), dtype=per_row.dtype).index_add_(0, traj, per_row)
    return per_traj[traj]


def set_greedy_baselines(
    batch: TrainBatch,
    groups: list[TrajectoryGroup],
    greedy: list[TrajectoryGroup],
    ol: OverlongConfig,
) -> dict[str, float]:
    """ReMax: each group's baseline (field ``baseline_rewards``) is the reward of its sample's
    greedy rollout (``greedy``, one per group) with the same overlong penalty; a greedy rollout
    that failed in the machinery falls back to the group's mean."""
    baseline: dict[str, float] = {}
    fallbacks = 0
    for group, g in zip(groups, greedy, strict=True):
        t = g.trajectories[0]
        if t.status.is_infra_failure:  # no greedy reward: the group's own mean stands in
            ok = [x.reward for x in group.trajectories if not x.status.is_infra_failure]
            baseline[group.uid] = sum(ok) / len(ok) if ok else 0.0
            fallbacks += 1
            continue
        pen = length_penalty(torch.tensor([float(t.num_generated_tokens)]), ol)
        baseline[group.uid] = t.reward + float(pen[0])
    batch["baseline_rewards"] = torch.tensor([baseline[r.uid] for r in batch.rows])
    values = list(baseline.values())
    return {
        "train/baseline_reward_mean": sum(values) / len(values),
        "train/baseline_fallback_rate": fallbacks / len(groups),
    }
