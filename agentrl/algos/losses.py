"""Policy losses, the clipped value loss and the entropy bonus.

    logprobs, old_logprobs, mask (B, T), advantages (B, T) or (B, 1)
        --POLICY_LOSSES.get(name)(..., cfg, agg=...)-->
        (scalar loss, metrics {pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl})

Advantages are token-level (B, T) or sequence-level (B, 1) (what grpo, dr_grpo, rloo and
reinforce_plus_plus_baseline return): a (B, 1) advantage broadcasts over the row's tokens and
gives exactly the loss and gradient of its masked (B, T) expansion, while the clip bounds are
built per row instead of per token. ``is_weights`` may be (B, 1) too; ``value_loss`` takes
(B, 1) returns.

Every policy loss builds a per-token loss matrix, multiplies it by the optional rollout
importance-sampling weights (:mod:`agentrl.algos.correction`) and hands it to the
:class:`~agentrl.algos.aggregation.Aggregation`. Metrics are detached 0-dim tensors (no device
sync); ``ppo_kl`` is the token-mean of ``old_logprobs - logprobs``.

Deliberate departures from the papers:
- Log-ratios are clamped to [-20, 20] before ``exp`` so one diverged token cannot give inf/NaN.
- GSPO is implemented in its GSPO-token form, s_it = sg(s_i) * pi_t / sg(pi_t): the value is the
  sequence ratio s_i and, with sequence-level advantages and ``seq-mean-token-mean``
  aggregation (the paper's), the gradient equals GSPO's; it also accepts token-level advantages.
- CISPO has no lower bound on the IS weight by default (``cispo_clip_low=None``), as in the
  MiniMax-M1 report; set one to clip below too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.algos.aggregation import Aggregation, masked_mean
from agentrl.algos.ops import (
    check_same_shape,
    check_token_or_row,
    empty_output,
    float_mask,
    row_chunks,
)
from agentrl.algos.registry import POLICY_LOSSES, register_policy_loss
from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

_LOG_RATIO_CLAMP = 20.0


@dataclass(kw_only=True)
class PolicyLossConfig:
    """Clip ranges of the policy losses; each loss reads only its own."""

    clip_ratio: float = 0.2
    """PPO epsilon, used for both sides unless clip_ratio_low/high are set."""
    clip_ratio_low: float | None = None
    """PPO lower epsilon: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float | None = None
    """PPO upper epsilon (DAPO clip-higher, e.g. 0.28): clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound c > 1 for negative advantages (loss <= -A * c); None disables it."""
    gspo_clip_low: float = 3e-4
    """GSPO lower epsilon on the sequence ratio (the paper's value)."""
    gspo_clip_high: float = 4e-4
    """GSPO upper epsilon on the sequence ratio (the paper's value)."""
    cispo_clip_low: float | None = None
    """CISPO lower epsilon on the IS weight; None: no lower bound."""
    cispo_clip_high: float = 0.28
    """CISPO upper epsilon: the IS weight is truncated at 1 + cispo_clip_high."""

    def __post_init__(self) -> None:
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ConfigError(
                f"clip_ratio_c must be > 1 (it bounds the loss at -A * c), got {self.clip_ratio_c}; "
                f"use 3.0 or None to disable dual clipping."
            )

    @property
    def ppo_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def ppo_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def _check(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> None:
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    check_token_or_row("advantages", advantages, "logprobs", logprobs)
    check_same_shape("mask", mask, "logprobs", logprobs)


def _finish(loss_mat: Tensor, mask: Tensor, agg: Aggregation, is_weights: Tensor | None) -> Tensor:
    if is_weights is not None:
        check_token_or_row("is_weights", is_weights, "loss", loss_mat)
        loss_mat = loss_mat * is_weights.detach()
    return agg(loss_mat, mask)


def _count(x: Tensor, threshold: float | Tensor, above: bool, out: Tensor) -> Tensor:
    """0/1 floats in ``out``: x > threshold (``above``) or x < threshold. Comparisons written
    into a float tensor skip the bool tensors, whose CPU kernels are about 10x slower."""
    return torch.gt(x, threshold, out=out) if above else torch.lt(x, threshold, out=out)


def _fractions(
    x: Tensor, mask: Tensor, tests: list[tuple[float | Tensor, bool, Tensor | None]]
) -> list[Tensor]:
    """For each (threshold, above, weight) the fraction of mask-1 tokens where x passes the
    test, each token weighted by ``weight`` (None: 1; (B, T) or (B, 1) 0/1 floats).

    Runs over cache-sized chunks of rows with float arithmetic only. No gradient, no sync.
    """
    with torch.no_grad():
        x = x.detach()
        m = float_mask(mask, x.dtype)
        counts = [x.new_zeros((), dtype=torch.float64) for _ in tests]
        for rows in row_chunks(x.shape[0], x.shape[1], x.device):
            xc, mc = x[rows], m[rows]
            buf = torch.empty_like(xc)
            for i, (threshold, above, weight) in enumerate(tests):
                hit = _count(xc, threshold, above, buf)
                if weight is not None:
                    hit.mul_(weight[rows])
                counts[i] += torch.dot(hit.view(-1), mc.reshape(-1))
        n = m.sum(dtype=torch.float64).clamp(min=1)
        return [(c / n).to(x.dtype) for c in counts]


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, low: float, high: float, clip_c: float | None, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """max(-A r, -A clip(r, 1-low, 1+high)), then min(., -A c) where A < 0 (dual clip).

    Computed in the equivalent one-clamp form -A * clamp(r, lo_t, hi_t), with per-token bounds
    (lo, hi) = (0, 1 + high) where A >= 0 and (1 - low, c) where A < 0: the same values and
    gradients (zero wherever the bound is active) with half the (B, T) temporaries. The bounds
    are float arithmetic on pos = [A >= 0] (no bool tensors).
    """
    with torch.no_grad():  # (B, T) constants: each written once, on huge pages on CPU
        a = advantages.detach()

        def new() -> Tensor:
            return empty_output(a.shape, like=a)

        pos = torch.ge(a, 0.0, out=new())  # 1.0 where A >= 0
        neg = torch.mul(pos, -1.0, out=new()).add_(1.0)  # 1 - pos
        lo_t = torch.mul(neg, 1.0 - low, out=new())  # 0 where A >= 0, 1 - low where A < 0
        # where A < 0 the upper bound is clip_c, or (None) a bound no ratio reaches
        top = torch.finfo(ratio.dtype).max if clip_c is None else clip_c
        hi_t = torch.mul(pos, 1.0 + high, out=new()).add_(neg, alpha=top)
    loss = (torch.clamp(ratio, lo_t, hi_t) * advantages).neg_()
    tests: list[tuple[float | Tensor, bool, Tensor | None]] = [
        (1.0 + high, True, pos),  # clipped above, A >= 0
        (1.0 - low, False, neg),  # clipped below, A < 0
    ]
    if clip_c is not None:
        tests.append((clip_c, True, neg))  # dual clip, A < 0
    fracs = _fractions(ratio, mask, tests)
    metrics = {
        "pg_clipfrac": fracs[0] + fracs[1],
        "pg_clipfrac_lower": fracs[2]
        if clip_c is not None
        else torch.zeros((), device=ratio.device),
    }
    return loss, metrics


@register_policy_loss("ppo_clip", description="PPO clipped surrogate, dual clip, clip-higher")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    agg: Aggregation,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """r_t = exp(logp_t - old_t); L_t = max(-A_t r_t, -A_t clip(r_t, 1 - e_low, 1 + e_high));
    where A_t < 0, L_t = min(L_t, -A_t c) (dual clip, Ye et al. 2020). loss = agg(w_t L_t)."""
    _check(logprobs, old_logprobs, advantages, mask)
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp_(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    loss_mat, metrics = _clipped_surrogate(
        log_ratio.exp(), advantages, cfg.ppo_low, cfg.ppo_high, cfg.clip_ratio_c, mask
    )
    loss = _finish(loss_mat, mask, agg, is_weights)
    metrics["ppo_kl"] = -masked_mean(log_ratio.detach(), mask)
    metrics["pg_loss"] = loss.detach()
    return loss, metrics


POLICY_LOSSES.register("vanilla", ppo_clip_loss, description="verl's name for ppo_clip")


@register_policy_loss("gspo", description="GSPO: clipped sequence-level (geometric mean) ratio")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    agg: Aggregation,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """log s_i = (1/|o_i|) sum_t m_t (logp_t - old_t)  (geometric mean of the token ratios);
    s_it = exp(sg(log s_i) + logp_t - sg(logp_t));
    L_t = max(-A_t s_it, -A_t clip(s_it, 1 - gspo_clip_low, 1 + gspo_clip_high)).
    Use ``seq-mean-token-mean`` aggregation for the paper's objective."""
    _check(logprobs, old_logprobs, advantages, mask)
    m = mask = mask.to(logprobs.dtype)
    tok_log_ratio = logprobs - old_logprobs
    seq_log_ratio = (tok_log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)  # (B,)
    log_s = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()
    ratio = log_s.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    loss_mat, metrics = _clipped_surrogate(
        ratio, advantages, cfg.gspo_clip_low, cfg.gspo_clip_high, None, mask
    )
    loss = _finish(loss_mat, mask, agg, is_weights)
    metrics["ppo_kl"] = -masked_mean(tok_log_ratio.detach(), mask)
    metrics["pg_loss"] = loss.detach()
    return loss, metrics


@register_policy_loss(
    "cispo", description="CISPO: REINFORCE with a clipped, stop-gradient IS weight"
)
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    agg: Aggregation,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """w_t = sg(clip(r_t, 1 - cispo_clip_low, 1 + cispo_clip_high)); L_t = -w_t A_t logp_t.

    The gradient is -w_t A_t grad(logp_t): every token keeps a gradient, clipping only
    bounds its weight (unlike PPO, which zeroes the gradient of clipped tokens).
    """
    _check(logprobs, old_logprobs, advantages, mask)
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp_(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    low = 0.0 if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
    weight = ratio.detach().clamp(low, 1.0 + cfg.cispo_clip_high)
    loss_mat = (weight.mul_(advantages) * logprobs).neg_()
    loss = _finish(loss_mat, mask, agg, is_weights)
    clip_hi, clip_lo = _fractions(
        ratio, mask, [(1.0 + cfg.cispo_clip_high, True, None), (low, False, None)]
    )
    metrics = {
        "pg_loss": loss.detach(),
        "pg_clipfrac": clip_hi,
        "pg_clipfrac_lower": clip_lo,
        "ppo_kl": -masked_mean(log_ratio.detach(), mask),
    }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.5,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped critic loss: v_c = old + clip(v - old, -clip, clip);
    L_t = 0.5 * max((v_t - R_t)^2, (v_c - R_t)^2) (unclipped 0.5 (v - R)^2 when clip is None).

    Returns (agg(L), {vf_loss, vf_clipfrac}).
    """
    check_same_shape("old_values", old_values, "values", values)
    check_token_or_row("returns", returns, "values", values)
    unclipped = (values - returns).square()
    if clip is None:
        loss_mat, clipfrac = 0.5 * unclipped, torch.zeros((), device=values.device)
    else:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clipped - returns).square()
        loss_mat, clipfrac = (
            0.5 * torch.maximum(unclipped, clipped),
            _fractions(clipped - unclipped, mask, [(0.0, True, None)])[0],
        )
    loss = agg(loss_mat, mask)
    return loss, {"vf_loss": loss.detach(), "vf_clipfrac": clipfrac}


def entropy_loss(
    entropy: Tensor, mask: Tensor, *, coef: float, agg: Aggregation
) -> tuple[Tensor, dict[str, Tensor]]:
    """Entropy bonus as a loss term: -coef * agg(entropy). Returns (loss, {entropy})."""
    check_same_shape("entropy", entropy, "mask", mask)
    ent = agg(entropy, mask)
    return -coef * ent, {"entropy": ent.detach()}
