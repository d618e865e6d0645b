"""KL penalties between the policy and a reference policy, as a loss or folded into the reward.

    logprobs (B, T), ref_logprobs (B, T) --KL_PENALTIES.get(kind)--> per-token KL (B, T)
      -> kl_loss(...)            aggregated and added to the policy loss (GRPO style), or
      -> apply_kl_to_reward(...) subtracted from token rewards, coef from a KL controller (PPO style)

Estimators of KL(pi || ref) from samples of pi, with d = logprobs - ref_logprobs (Schulman, 2020):
- ``k1`` (verl's ``kl``): d                     unbiased, high variance, can be negative
- ``abs``: |d|
- ``k2`` (alias ``mse``): d^2 / 2              biased, low variance
- ``k3`` (alias ``low_var_kl``): exp(-d) + d - 1  unbiased, low variance, >= 0; clamped to [-10, 10]

Straight-through variants ``k1+``, ``k3+``, ``abs+``, ``low_var_kl+``: the value of the named
estimator with the gradient of k2, ``k2 + (x - k2).detach()``. The gradient of k2 with respect
to the policy is d * grad(logprob), whose expectation under pi is the gradient of KL(pi || ref),
while the gradients of k1 and k3 taken as losses are biased; the straight-through form logs the
chosen estimator's value and optimises with an unbiased gradient.

Deliberate departure: k3 is computed from the clamped log-ratio d in [-20, 20] before the
exponential, so a token with a huge log-ratio cannot produce inf.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.algos.aggregation import Aggregation, masked_mean
from agentrl.algos.ops import check_same_shape, empty_output, row_chunks
from agentrl.algos.registry import KL_PENALTIES, register_kl
from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

_LOG_RATIO_CLAMP = 20.0


@register_kl("k1", description="log(pi/ref): unbiased, high variance")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = logprobs - ref_logprobs."""
    return logprobs - ref_logprobs


@register_kl("abs", description="|log(pi/ref)|")
def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """|logprobs - ref_logprobs|."""
    return (logprobs - ref_logprobs).abs()


@register_kl("k2", description="0.5 * log(pi/ref)^2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = 0.5 * (logprobs - ref_logprobs)^2."""
    return 0.5 * (logprobs - ref_logprobs).square()


@register_kl("k3", description="ref/pi - log(ref/pi) - 1: unbiased, low variance")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10].

    Without a gradient to track it runs in place over cache-sized chunks of rows: one (B, T)
    result and no (B, T) temporaries.
    """
    tracked = torch.is_grad_enabled() and (logprobs.requires_grad or ref_logprobs.requires_grad)
    if tracked or logprobs.shape != ref_logprobs.shape or logprobs.dim() != 2:
        log_ratio = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)
    out = empty_output(logprobs.shape, like=logprobs)
    for rows in row_chunks(out.shape[0], out.shape[1], out.device):
        d = torch.sub(ref_logprobs[rows], logprobs[rows]).clamp_(
            -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP
        )
        torch.exp(d, out=out[rows]).sub_(d).sub_(1.0).clamp_(-10.0, 10.0)
    return out


KL_PENALTIES.register("mse", kl_k2, description="alias of k2")
KL_PENALTIES.register("low_var_kl", kl_k3, description="alias of k3")


def straight_through(
    value_fn: Callable[[Tensor, Tensor], Tensor],
) -> Callable[[Tensor, Tensor], Tensor]:
    """An estimator with the value of ``value_fn`` and the gradient of k2."""

    def kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
        k2 = kl_k2(logprobs, ref_logprobs)
        return k2 + (value_fn(logprobs, ref_logprobs) - k2).detach()

    kl.__name__ = kl.__qualname__ = f"{value_fn.__name__}_straight_through"
    kl.__doc__ = f"Value of {value_fn.__name__}, gradient of k2."
    return kl


kl_k1_st = straight_through(kl_k1)
kl_k3_st = straight_through(kl_k3)
kl_abs_st = straight_through(kl_abs)
KL_PENALTIES.register("k1+", kl_k1_st, description="value of k1, gradient of k2")
KL_PENALTIES.register("k3+", kl_k3_st, description="value of k3, gradient of k2")
KL_PENALTIES.register("low_var_kl+", kl_k3_st, description="value of k3, gradient of k2")
KL_PENALTIES.register("abs+", kl_abs_st, description="value of |d|, gradient of k2")
KL_PENALTIES.register("k2+", kl_k2, description="k2 (its own gradient)")
KL_PENALTIES.register("kl", kl_k1, description="verl's name for k1")
KL_PENALTIES.register("kl+", kl_k1_st, description="verl's name for k1+")
KL_PENALTIES.register("mse+", kl_k2, description="verl's mse+: k2 (its own gradient)")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate (B, T) of the registered ``kind``."""
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    fn: Callable[[Tensor, Tensor], Tensor] = KL_PENALTIES.get(kind)
    return fn(logprobs, ref_logprobs)


def kl_loss(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: str, *, agg: Aggregation
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL as a loss term: agg(kl_penalty(kind)); multiply by the KL coefficient yourself.

    Returns (loss, {"kl_loss": loss.detach()}).
    """
    loss = agg(kl_penalty(logprobs, ref_logprobs, kind), mask)
    return loss, {"kl_loss": loss.detach()}


def apply_kl_to_reward(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kind: str,
    coef: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """r'_t = r_t - coef * KL_t on mask-1 tokens (no gradient). Returns (r' (B, T), metrics).

    metrics: ``kl`` (token-mean KL over mask-1 tokens, what a KL controller consumes) and
    ``kl_coef``.
    """
    check_same_shape("token_rewards", token_rewards, "logprobs", logprobs)
    with torch.no_grad():
        kl = kl_penalty(logprobs, ref_logprobs, kind) * mask.to(logprobs.dtype)
        new_rewards = token_rewards - coef * kl
        current = masked_mean(kl, mask)
    return new_rewards, {"kl": current, "kl_coef": torch.tensor(coef)}


@dataclass(kw_only=True)
class FixedKLController:
    """A constant KL coefficient."""

    value: float = 0.001

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


@dataclass(kw_only=True)
class AdaptiveKLController:
    """The adaptive coefficient of Ziegler et al. (2019).

    e = clip(current_kl / target - 1, -0.2, 0.2)
    value <- value * (1 + e * n_steps / horizon)
    """

    value: float = 0.001
    target: float = 6.0
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.target <= 0 or self.horizon <= 0:
            raise ConfigError(
                f"AdaptiveKLController needs target > 0 and horizon > 0, got target={self.target}, "
                f"horizon={self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the target after ``n_steps`` samples at ``current_kl``."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
