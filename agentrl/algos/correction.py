"""Rollout importance-sampling correction: the inference engine is not the trainer.

    old_logprobs (B, T)      trainer's logprobs of the sampled tokens, at the rollout's weights
    rollout_logprobs (B, T)  the inference server's logprobs of the same tokens
      -> rollout_is_weights(...) -> weights (B, T) (no gradient), metrics
      -> policy loss(..., is_weights=weights)

The tokens were sampled from the server's distribution mu (different kernels, precision,
sampling code), while the loss assumes pi_old. Truncated importance sampling (TIS) reweights
each token (``level="token"``: w_t = min(pi_old_t / mu_t, cap)) or each sequence
(``level="sequence"``: w_i = min(prod_t pi_old_t / mu_t, cap), the same weight on all its
tokens). Truncation trades a small bias for bounded variance.

Deliberate departures: log-ratios are clamped to [-20, 20] before ``exp``; the weight is only
capped above (no lower truncation), as in the TIS proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from agentrl.algos.aggregation import masked_mean
from agentrl.algos.ops import check_same_shape
from agentrl.errors import ConfigError

_LOG_RATIO_CLAMP = 20.0


class ISLevel(StrEnum):
    TOKEN = "token"
    SEQUENCE = "sequence"


@dataclass(kw_only=True)
class ISCorrectionConfig:
    """Truncated importance sampling between trainer and rollout logprobs."""

    level: ISLevel = ISLevel.TOKEN
    """``token``: one weight per token; ``sequence``: the product of a sequence's token ratios."""
    cap: float = 2.0
    """Upper truncation of the weight (C in min(ratio, C))."""

    def __post_init__(self) -> None:
        if self.cap <= 0:
            raise ConfigError(f"ISCorrectionConfig.cap must be > 0, got {self.cap}; try 2.0")
        try:
            self.level = ISLevel(self.level)
        except ValueError:
            raise ConfigError(
                f"ISCorrectionConfig.level must be 'token' or 'sequence', got {self.level!r}"
            ) from None


def rollout_is_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cfg: ISCorrectionConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """TIS weights (B, T), 0 on mask-0 tokens, detached; and metrics.

    token:    w_t = min(exp(old_t - rollout_t), cap)
    sequence: w_i = min(exp(sum_t m_t (old_t - rollout_t)), cap), broadcast to i's tokens
    metrics: is_weight_mean / is_weight_max (over tokens or sequences), is_capped_frac,
    mismatch_k1 = mean(rollout - old) and mismatch_k3 = mean(exp(old - rollout) - (old - rollout)
    - 1), token-means over mask-1 tokens estimating KL(rollout || trainer).
    """
    check_same_shape("rollout_logprobs", rollout_logprobs, "old_logprobs", old_logprobs)
    check_same_shape("mask", mask, "old_logprobs", old_logprobs)
    with torch.no_grad():
        m = mask.to(old_logprobs.dtype)
        log_ratio = (old_logprobs - rollout_logprobs) * m
        if cfg.level is ISLevel.TOKEN:
            raw = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
            unit_mask = m
        else:
            seq = log_ratio.sum(-1).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
            raw = seq.exp()  # (B,)
            unit_mask = (m.sum(-1) > 0).to(m.dtype)
        capped = raw.clamp(max=cfg.cap)
        metrics = {
            "is_weight_mean": masked_mean(capped, unit_mask),
            "is_weight_max": (capped * unit_mask).max(),
            "is_capped_frac": masked_mean((raw > cfg.cap).to(m.dtype), unit_mask),
            "mismatch_k1": masked_mean(-log_ratio, m),
            "mismatch_k3": masked_mean(log_ratio.exp() - log_ratio - 1, m),
        }
        weights = capped * m if cfg.level is ISLevel.TOKEN else capped[:, None] * m
    return weights, metrics
