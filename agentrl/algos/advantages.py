"""Advantage estimators: rewards (and values) in, per-token advantages and returns out.

    AdvantageInputs(response_mask (B, T), rewards (B,) | token_rewards (B, T), values, group_ids)
      -> ADV_ESTIMATORS.get(name)(inputs, AdvantageConfig) -> (advantages, returns)

Output shapes: estimators whose advantage varies along a sequence (gae, reinforce_plus_plus,
remax) return (B, T) tensors that are 0 wherever ``response_mask`` is 0. The sequence-level
estimators (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline) give every generated token of a
row the same value and return it once per row, (B, 1): it broadcasts against the (B, T) mask
in the policy losses, the masked statistics of :mod:`agentrl.algos.aggregation` and
``TrainBatch`` (which keeps (B, 1) fields through select/split/concat), so a training step
never writes, stores, ships to the workers or reads back a (B, T) tensor of repeated values.
Its value on mask-0 tokens is whatever the row's value is: always apply the mask (every
function of this package does), or call :func:`token_level` for a dense (B, T) tensor that is 0
off the mask.

Every estimator is vectorised: group statistics use ``index_add`` over dense group ids and
time recursions use the blocked scans of :mod:`agentrl.algos.ops` over cache-sized chunks of
rows (skipping multi-turn holes by counting them, :func:`agentrl.algos.ops.count_scan`);
nothing loops over samples, groups or time steps in Python. Estimators without a critic
return the advantages tensor itself as the returns (not a copy). Advantages are constants of
the policy loss, so estimators run under ``torch.no_grad`` and work in place where they can
(on CPU a fresh (B, T) tensor costs page faults that dwarf the arithmetic; the (B, T)
results are allocated with :func:`agentrl.algos.ops.empty_output`, on huge pages).

Deliberate departures from the papers and common implementations:
- Multi-turn masks with holes: GAE and discounted returns run over generated (mask-1) tokens
  only. Environment tokens between turns are skipped, as if the generated tokens of one
  trajectory were one contiguous sequence; rewards placed on mask-0 tokens are dropped (they
  must be finite: masks are applied by multiplication, as in verl).
- Precision: whitening accumulates in float64 and GAE with gamma * lam > 0.995 runs each
  chunk's deltas and scan in float64, so float32 results stay within 1e-5 of float64 ones.
- Groups of one sample (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) get advantage 0: the
  sample is its own baseline, so it carries no relative signal (instead of the raw score).
- Group std is the unbiased (n - 1) std; GRPO divides by ``std + epsilon``.
- Whitening (GAE, REINFORCE++) uses the mean and unbiased variance over all mask-1 tokens of
  the batch on this process; it is not all-reduced across data-parallel ranks.
- Dr.GRPO is "GRPO done right" for the advantage (no std division); its second fix, no
  per-sequence length normalisation, is a loss aggregation choice: pair ``dr_grpo`` with
  ``Aggregation("seq-mean-token-sum-norm", max_len=<generation budget>)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.algos.aggregation import Moments, masked_whiten, whiten_into
from agentrl.algos.ops import (
    Scratch,
    TokenLayout,
    check_same_shape,
    check_token_or_row,
    count_scan,
    count_scan_fits,
    count_scan_inputs,
    discounted_reverse_cumsum,
    empty_output,
    final_reward_returns,
    float_mask,
    group_mean_std,
    is_prefix_mask,
    masked_discounted_returns,
    row_chunks,
    scatter_to_last_token,
)
from agentrl.algos.registry import ADV_ESTIMATORS, register_advantage
from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class AdvantageConfig:
    """Knobs shared by the estimators; each reads only the ones it needs."""

    gamma: float = 1.0
    """Discount (gae, reinforce_plus_plus, remax)."""
    lam: float = 1.0
    """GAE lambda."""
    norm_by_std: bool = True
    """GRPO: divide by the group std. dr_grpo ignores this and never divides."""
    epsilon: float = 1e-6
    """Added to the group std before dividing (grpo)."""
    whiten: bool = True
    """GAE: whiten advantages over the batch's mask-1 tokens."""


@dataclass(frozen=True, kw_only=True)
class AdvantageInputs:
    """What an estimator may read. Give ``rewards`` (B,) or ``token_rewards`` (B, T), or both."""

    response_mask: Tensor  # (B, T) 1 on generated tokens, 0 on prompt/env/padding
    rewards: Tensor | None = None  # (B,) sequence-level score
    token_rewards: Tensor | None = None  # (B, T) per-token rewards (e.g. score - KL penalty)
    values: Tensor | None = None  # (B, T) critic values (gae)
    group_ids: Tensor | None = None  # (B,) int group of each sample (grpo, rloo, ...)
    baseline_rewards: Tensor | None = None  # (B,) greedy-decoding reward (remax)

    def __post_init__(self) -> None:
        if self.response_mask.dim() != 2:
            raise ConfigError(
                f"response_mask must be (B, T), got {tuple(self.response_mask.shape)}"
            )
        if self.rewards is None and self.token_rewards is None:
            raise ConfigError(
                "AdvantageInputs needs rewards (B,) or token_rewards (B, T); got neither"
            )
        b = self.response_mask.shape[0]
        for name in ("rewards", "group_ids", "baseline_rewards"):
            x = getattr(self, name)
            if x is not None and tuple(x.shape) != (b,):
                raise ConfigError(f"{name} must be (B,) = ({b},), got {tuple(x.shape)}")
        for name in ("token_rewards", "values"):
            x = getattr(self, name)
            if x is not None:
                check_same_shape(name, x, "response_mask", self.response_mask)

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the rewards (float32 for integer rewards)."""
        ref = self.token_rewards if self.token_rewards is not None else self.rewards
        assert ref is not None  # guaranteed by __post_init__
        return ref.dtype if ref.is_floating_point() else torch.float32

    @property
    def mask(self) -> Tensor:
        """The response mask as a (B, T) float tensor of the reward dtype (a copy)."""
        return self.response_mask.to(self.dtype)

    def scores(self) -> Tensor:
        """(B,) sequence scores: ``rewards``, else the sum of token rewards over mask-1 tokens.

        Token rewards must be finite (a masked-out inf or NaN would leak into the sum).
        """
        if self.rewards is not None:
            return self.rewards.to(self.dtype)
        assert self.token_rewards is not None
        r, m = self.token_rewards, self.response_mask
        out = torch.empty(r.shape[0], dtype=self.dtype, device=r.device)
        scratch = Scratch()
        for rows in row_chunks(r.shape[0], r.shape[1], r.device):  # the product stays in cache
            prod = scratch.get("prod", rows.stop - rows.start, r.shape[1], out)
            torch.mul(r[rows], float_mask(m[rows], self.dtype), out=prod)
            torch.sum(prod, -1, out=out[rows])
        return out

    def per_token_rewards(self) -> Tensor:
        """(B, T) rewards: ``token_rewards``, else ``rewards`` on the last generated token."""
        if self.token_rewards is not None:
            return self.token_rewards
        return scatter_to_last_token(self.scores(), self.response_mask)

    def discounted_returns(self, gamma: float) -> Tensor:
        """(B, T) discounted returns over mask-1 tokens (closed form for sequence rewards)."""
        if self.token_rewards is None:
            return final_reward_returns(self.scores(), self.response_mask, gamma)
        return masked_discounted_returns(self.token_rewards, self.response_mask, gamma)

    def require(self, name: str, estimator: str) -> Tensor:
        x = getattr(self, name)
        if x is None:
            raise ConfigError(
                f"advantage estimator {estimator!r} needs AdvantageInputs.{name}; got None"
            )
        return x  # type: ignore[no-any-return]


LONG_HORIZON = 0.995
"""gamma * lam above which GAE computes its deltas and scan in float64 (see :func:`gae`)."""


@torch.no_grad()
def gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    lam: float,
    on_chunk: Callable[[Tensor, Tensor], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the mask-1 tokens of each row.

    With next(t) the next mask-1 position after t (V_next = 0 past the last one):
        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)
        R_t     = A_t + V_t
    Returns (A, R), both (B, T) and 0 on mask-0 tokens. Not whitened. No gradient.
    Runs one cache-sized chunk of rows at a time (:func:`agentrl.algos.ops.row_chunks`);
    ``on_chunk(A[rows], mask[rows])`` sees each chunk of advantages while it is in cache.
    Rows without holes scan the deltas in place. Masks with holes skip them without moving
    tokens: every V_k of a mask-1 k after t enters A_t twice, once as -V_k in delta_k and once
    as gamma * V_next in the delta of the mask-1 token before k, so with c = gamma * lam and
    n(t, k) the mask-1 tokens in [t, k):
        A_t = sum_{k >= t, mask-1} c^n(t, k) (r_k + (1 / lam - 1) V_k)  -  V_t / lam,
    one discounted sum that skips holes (:func:`agentrl.algos.ops.count_scan`). Where that does
    not apply (lam < 1/2, where the last subtraction would cancel more than a bit, or c^T
    beyond float64) the generated tokens are packed first (``TokenLayout``), where
    next(t) = t + 1.
    """
    check_same_shape("values", values, "token_rewards", token_rewards)
    check_same_shape("mask", mask, "token_rewards", token_rewards)
    adv = empty_output(token_rewards.shape, like=token_rewards)
    ret = empty_output(token_rewards.shape, like=token_rewards)
    b, t = adv.shape
    # Long horizons (gamma * lam near 1) sum thousands of deltas, each rounded in float32 (the
    # sum's error grows like sqrt(T) eps); there the deltas and the scan of a chunk, in
    # cache, run in float64 and only the results are rounded to float32.
    long = gamma * lam > LONG_HORIZON and adv.dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    )
    work = torch.float64 if long else adv.dtype
    c = gamma * lam
    by_counts = lam >= 0.5 and (
        count_scan_fits(t, c, work) or (c == 1.0 and work in (torch.float32, torch.float64))
    )
    scratch = Scratch()
    for rows in row_chunks(b, t, adv.device):  # cache-sized chunks of rows, see ops.row_chunks
        m = float_mask(mask[rows], adv.dtype)
        prefix = is_prefix_mask(m, scratch)
        if by_counts and not prefix:
            _gae_skipping_holes(
                token_rewards[rows],
                values[rows],
                m,
                gamma,
                lam,
                work,
                scratch,
                adv[rows],
                ret[rows],
            )
            if on_chunk is not None:
                on_chunk(adv[rows], m)
            continue
        layout = TokenLayout.of(m, scratch, prefix=prefix)
        delta = layout.pack(token_rewards[rows], "r").to(work)  # (R, W), becomes delta in place
        v = layout.pack(values[rows], "v").to(work)  # (R, W), 0 past each row's generated tokens
        delta[:, :-1].add_(v[:, 1:], alpha=gamma)
        delta.sub_(v)
        if work == adv.dtype and layout.index is None and layout.width == t:  # write in place
            a = discounted_reverse_cumsum(delta, c, out=adv[rows])
            torch.add(v, a, out=ret[rows])
        else:
            y = scratch.get("scan", delta.shape[0], delta.shape[1], delta)
            a = discounted_reverse_cumsum(delta, c, out=y)
            layout.unpack_into(a.to(adv.dtype), adv[rows])
            layout.unpack_into(v.add_(a).to(adv.dtype), ret[rows])  # 0 past generated tokens
        if on_chunk is not None:
            on_chunk(adv[rows], m)
    return adv, ret


def _gae_skipping_holes(
    r: Tensor,
    v: Tensor,
    m: Tensor,
    gamma: float,
    lam: float,
    work: torch.dtype,
    scratch: Scratch,
    adv: Tensor,
    ret: Tensor,
) -> None:
    """GAE of a chunk of rows whose mask has holes, in closed form over a discounted sum that
    skips them (see :func:`gae`); ``work`` is the dtype of that sum."""
    t = m.shape[1]
    x, mw = count_scan_inputs(m, work, scratch)
    xt = x[:, :t]
    if work == r.dtype:
        torch.add(r, v, alpha=1.0 / lam - 1.0, out=xt).mul_(m)
    else:  # float64 work for float32 inputs: no rounding before the sum
        xt.copy_(r).add_(v, alpha=1.0 / lam - 1.0).mul_(m)
    y = scratch.get("gae_sum", m.shape[0], t, x)
    if gamma * lam == 1.0:  # no discount: skipping a hole changes nothing
        scan = scratch.get("gae_scan", x.shape[0], x.shape[1], x)
        y.copy_(discounted_reverse_cumsum(x, 1.0, out=scan)[:, :t])
    else:
        count_scan(x, mw, gamma * lam, scratch, y, masked=False)
    torch.sub(y, v, alpha=1.0 / lam, out=adv).mul_(m)  # A = (y - V / lam) m, rounded once
    torch.addcmul(adv, v, m, out=ret)  # R = A + V on mask-1 tokens


@register_advantage("gae", description="PPO with a critic: GAE(gamma, lambda), whitened")
@torch.no_grad()
def gae_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """GAE (see :func:`gae`); advantages whitened over the batch when ``cfg.whiten``
    (statistics gathered while each chunk is in cache, then one pass in place)."""
    values = inp.require("values", "gae")
    acc = Moments() if cfg.whiten else None
    adv, ret = gae(
        inp.per_token_rewards(),
        values,
        inp.response_mask,
        gamma=cfg.gamma,
        lam=cfg.lam,
        on_chunk=acc.add_masked if acc is not None else None,  # A is 0 off the mask
    )
    if acc is not None:  # adv is ours: whitened in place
        adv = whiten_into(adv, adv, inp.response_mask, acc.result(), masked=True)
    return adv, ret


def _per_row(adv_B: Tensor) -> tuple[Tensor, Tensor]:
    adv = adv_B[:, None]  # (B, 1), broadcast over the row's tokens; returns are the same tensor
    return adv, adv


def token_level(x: Tensor, mask: Tensor) -> Tensor:
    """A dense (B, T) copy of advantages or returns: (B, 1) values spread over the mask-1 tokens
    of each row, 0 elsewhere; a (B, T) input is masked the same way."""
    check_token_or_row("x", x, "mask", mask)
    m = float_mask(mask, x.dtype)  # x must be finite off the mask
    if torch.is_grad_enabled() and x.requires_grad:
        return x * m
    return torch.mul(x, m, out=empty_output(mask.shape, like=x))  # one pass, on huge pages


def _group_ids(inp: AdvantageInputs, estimator: str) -> Tensor:
    return inp.require("group_ids", estimator)


def group_normalized_scores(
    scores: Tensor, group_ids: Tensor, *, norm_by_std: bool = True, epsilon: float = 1e-6
) -> Tensor:
    """(B,) sequence-level GRPO advantage: (s_i - mean_g) / (std_g + epsilon), or s_i - mean_g.

    Groups are arbitrary integer ids; a group of one gets 0.
    """
    mean, std, _ = group_mean_std(scores, group_ids)
    adv = scores - mean
    return adv / (std + epsilon) if norm_by_std else adv


def leave_one_out_scores(scores: Tensor, group_ids: Tensor) -> Tensor:
    """(B,) RLOO advantage: s_i - mean of the other members = n_g / (n_g - 1) * (s_i - mean_g).

    A group of one gets 0.
    """
    mean, _, n = group_mean_std(scores, group_ids)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return (scores - mean) * scale


@register_advantage("grpo", description="GRPO: (score - group mean) / (group std + eps)")
@torch.no_grad()
def grpo_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon), one value per row: (B, 1).

    Without ``cfg.norm_by_std`` it is s_i - mean_g(s). Returns = advantages.
    """
    adv = group_normalized_scores(
        inp.scores(), _group_ids(inp, "grpo"), norm_by_std=cfg.norm_by_std, epsilon=cfg.epsilon
    )
    return _per_row(adv)


ADV_ESTIMATORS.register("grpo_vectorized", grpo_advantage, description="verl's name for grpo")


@register_advantage("dr_grpo", description="Dr.GRPO: score - group mean, no std division")
@torch.no_grad()
def dr_grpo_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """A_i = s_i - mean_g(s) (no std normalisation), one value per row: (B, 1).

    Dr.GRPO also drops the 1/|o_i| length normalisation: aggregate its loss with
    ``seq-mean-token-sum-norm`` and a constant ``max_len`` (the generation budget).
    """
    adv = group_normalized_scores(inp.scores(), _group_ids(inp, "dr_grpo"), norm_by_std=False)
    return _per_row(adv)


@register_advantage("rloo", description="RLOO: score minus the mean of the other group members")
@torch.no_grad()
def rloo_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1) = n_g / (n_g - 1) * (s_i - mean_g).

    A group of one gets 0. One value per row, (B, 1); returns = advantages.
    """
    return _per_row(leave_one_out_scores(inp.scores(), _group_ids(inp, "rloo")))


ADV_ESTIMATORS.register("rloo_vectorized", rloo_advantage, description="verl's name for rloo")


@register_advantage("reinforce_plus_plus", description="REINFORCE++: discounted returns, whitened")
@torch.no_grad()
def reinforce_pp_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """G_t = r_t + gamma * G_next(t) over mask-1 tokens; A = whiten(G) over the batch.

    Put any KL penalty into ``token_rewards`` first (:func:`agentrl.algos.kl.apply_kl_to_reward`).
    Returns (A, G).
    """
    if inp.token_rewards is None:
        returns = inp.discounted_returns(cfg.gamma)
        return masked_whiten(returns, inp.response_mask), returns
    acc = Moments()  # statistics of each chunk of returns while it is in cache
    returns = masked_discounted_returns(
        inp.token_rewards, inp.response_mask, cfg.gamma, on_chunk=acc.add_masked
    )  # 0 off the mask
    adv = empty_output(returns.shape, like=returns)
    return whiten_into(adv, returns, inp.response_mask, acc.result(), masked=True), returns


@register_advantage(
    "reinforce_plus_plus_baseline", description="REINFORCE++-baseline: group mean, batch whitening"
)
@torch.no_grad()
def reinforce_pp_baseline_advantage(
    inp: AdvantageInputs, cfg: AdvantageConfig
) -> tuple[Tensor, Tensor]:
    """A = whiten_batch((s_i - mean_g(s)) on the mask-1 tokens of i), (B, 1). Returns = A.

    Whitening a per-row value weights row i by its token count n_i (one pass over the mask):
    mean = sum n_i c_i / N, var = sum n_i (c_i - mean)^2 / (N - 1).
    """
    ids = _group_ids(inp, "reinforce_plus_plus_baseline")
    centred = group_normalized_scores(inp.scores(), ids, norm_by_std=False)
    return _per_row(masked_whiten(centred[:, None], inp.response_mask)[:, 0])


@register_advantage("remax", description="ReMax: return minus the greedy-decoding reward")
@torch.no_grad()
def remax_advantage(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """G_t = discounted return over mask-1 tokens; A_t = G_t - b_i, b_i the greedy reward.

    With a single final reward and gamma = 1, A_t = s_i - b_i on every generated token.
    Returns (A, G).
    """
    baseline = inp.require("baseline_rewards", "remax")
    returns = inp.discounted_returns(cfg.gamma)  # 0 on mask-0 tokens
    m = float_mask(inp.response_mask, returns.dtype)
    b = baseline.to(returns.dtype)[:, None]
    adv = torch.addcmul(returns, m, b, value=-1.0, out=empty_output(returns.shape, like=returns))
    return adv, returns
