"""Sequence-level (B, 1) advantages: estimator shapes, and every consumer treating (B, 1) exactly
as its masked (B, T) expansion (losses x aggregation modes, IS weights, value loss, masked
statistics, KL in the reward)."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    AdvantageInputs,
    AggMode,
    Aggregation,
    PolicyLossConfig,
    agg_loss,
    apply_kl_to_reward,
    masked_mean,
    masked_var,
    masked_whiten,
    token_level,
    value_loss,
)
from agentrl.algos.advantages import group_normalized_scores, leave_one_out_scores
from agentrl.algos.aggregation import masked_sum
from agentrl.errors import ConfigError

SEQUENCE_LEVEL = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline")
B, T = 6, 40


def _mask() -> torch.Tensor:
    """Multi-turn rows with holes, a prompt-like leading 0, one empty row, one full row."""
    pos = torch.arange(T)
    lengths = torch.tensor([40, 25, 12, 0, 33, 7])
    m = (pos[None, :] < lengths[:, None]) & ((pos[None, :] + torch.arange(B)[:, None]) % 9 != 0)
    m[:, 0] = False
    m[1] = True  # a full row: no padding, no holes
    m[3] = False  # a row with no generated token (a masked-out sample)
    return m.float()


MASK = _mask()
IDS = torch.tensor([5, -2, 5, -2, 5, 9])  # non-contiguous, with a singleton group


def _inputs(gen: torch.Generator) -> AdvantageInputs:
    return AdvantageInputs(
        response_mask=MASK,
        token_rewards=torch.randn(B, T, generator=gen) * MASK,
        group_ids=IDS,
    )


@pytest.mark.parametrize("name", SEQUENCE_LEVEL)
def test_sequence_estimators_return_one_value_per_row(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    inp = _inputs(gen)
    adv, ret = ADV_ESTIMATORS.get(name)(inp, AdvantageConfig())
    assert adv.shape == (B, 1) and ret is adv and not adv.requires_grad
    scores = (inp.token_rewards * MASK).sum(-1)  # type: ignore[operator]
    if name == "rloo":
        per_row = leave_one_out_scores(scores, IDS)
    else:
        per_row = group_normalized_scores(scores, IDS, norm_by_std=name == "grpo")
    dense = per_row[:, None] * MASK
    if name == "reinforce_plus_plus_baseline":
        vals = dense[MASK.bool()]
        dense = (dense - vals.mean()) / vals.std() * MASK
    torch.testing.assert_close(token_level(adv, MASK), dense, atol=1e-5, rtol=1e-5)
    assert token_level(adv, MASK)[3].abs().sum() == 0  # the empty row has no token to carry it


def test_token_level_checks_shapes() -> None:
    with pytest.raises(ConfigError, match=r"\(6, 1\)"):
        token_level(torch.zeros(6, 3), MASK)
    dense = torch.randn(B, T)
    torch.testing.assert_close(token_level(dense, MASK), dense * MASK)
    assert token_level(dense.double(), MASK.bool()).dtype == torch.float64  # the values' dtype


def test_token_level_keeps_the_gradient() -> None:
    row = torch.randn(B, 1, requires_grad=True)
    token_level(row, MASK).sum().backward()
    assert row.grad is not None
    torch.testing.assert_close(row.grad, MASK.sum(-1, keepdim=True))


def _loss_args(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    old = -torch.rand(B, T, generator=gen) * 3
    logprobs = old + torch.randn(B, T, generator=gen) * 0.3  # some ratios outside the clip range
    return logprobs, old


@pytest.mark.parametrize("mode", [m.value for m in AggMode])
@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES.ids()))
@pytest.mark.parametrize("normaliser", [None, 7.0])
def test_policy_losses_row_advantage_equals_dense(
    loss_name: str, mode: str, normaliser: float | None
) -> None:
    gen = torch.Generator().manual_seed(1)
    lp0, old = _loss_args(gen)
    adv_row = torch.tensor([[1.5], [-0.7], [0.0], [2.0], [-2.5], [0.3]])
    w_row = torch.rand(B, 1, generator=gen) + 0.5
    agg = Aggregation(mode=mode, normaliser=normaliser, max_len=50)
    cfg = PolicyLossConfig(clip_ratio_high=0.28)
    fn = POLICY_LOSSES.get(loss_name)
    results = []
    for adv, w in ((adv_row, w_row), (token_level(adv_row, MASK), w_row.expand(B, T) * MASK)):
        lp = lp0.clone().requires_grad_()
        loss, metrics = fn(lp, old, adv, MASK, cfg, agg=agg, is_weights=w)
        loss.backward()
        results.append((loss.detach(), metrics, lp.grad))
    (l1, m1, g1), (l2, m2, g2) = results
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(g1, g2)
    assert g1 is not None and g1.abs().sum() > 0
    assert set(m1) == set(m2)
    for k in m1:
        torch.testing.assert_close(m1[k], m2[k], msg=k)


def test_policy_loss_rejects_wrong_advantage_shape() -> None:
    lp, old = _loss_args(torch.Generator().manual_seed(2))
    with pytest.raises(ConfigError, match="advantages"):
        POLICY_LOSSES.get("ppo_clip")(
            lp, old, torch.zeros(B, 2), MASK, PolicyLossConfig(), agg=Aggregation()
        )


@pytest.mark.parametrize("mode", [m.value for m in AggMode])
@pytest.mark.parametrize("normaliser", [None, 3.0])
def test_agg_loss_row_values_equal_dense(mode: str, normaliser: float | None) -> None:
    x = torch.randn(B, 1, generator=torch.Generator().manual_seed(3), requires_grad=True)
    row = agg_loss(x, MASK, mode, normaliser=normaliser)
    dense = agg_loss(x.expand(B, T), MASK, mode, normaliser=normaliser)
    torch.testing.assert_close(row, dense)
    (g_row,) = torch.autograd.grad(row, x)
    (g_dense,) = torch.autograd.grad(dense, x)
    torch.testing.assert_close(g_row, g_dense)


def test_masked_statistics_of_row_values() -> None:
    x = torch.tensor([[1.0], [2.0], [-1.0], [100.0], [0.5], [3.0]])  # row 3 has no tokens
    dense = x.expand(B, T)
    torch.testing.assert_close(masked_sum(x, MASK), masked_sum(dense, MASK))
    torch.testing.assert_close(masked_mean(x, MASK), masked_mean(dense, MASK))
    torch.testing.assert_close(masked_var(x, MASK), masked_var(dense, MASK))
    torch.testing.assert_close(masked_mean(x.abs(), MASK), masked_mean(dense.abs(), MASK))
    for shift in (True, False):
        white = masked_whiten(x, MASK, shift_mean=shift)
        assert white.shape == (B, 1) and white[3, 0] == 0
        ref = masked_whiten(dense.clone(), MASK, shift_mean=shift)
        torch.testing.assert_close(token_level(white, MASK), ref, atol=1e-5, rtol=1e-5)


def test_value_loss_with_row_returns() -> None:
    gen = torch.Generator().manual_seed(4)
    values = torch.randn(B, T, generator=gen, requires_grad=True)
    old = values.detach() + 0.3 * torch.randn(B, T, generator=gen)
    ret = torch.randn(B, 1, generator=gen)
    agg = Aggregation(mode="token-mean")
    l_row, m_row = value_loss(values, old, ret, MASK, clip=0.2, agg=agg)
    l_dense, m_dense = value_loss(values, old, ret.expand(B, T), MASK, clip=0.2, agg=agg)
    torch.testing.assert_close(l_row, l_dense)
    torch.testing.assert_close(m_row["vf_clipfrac"], m_dense["vf_clipfrac"])


def test_kl_in_reward_feeds_row_advantages() -> None:
    gen = torch.Generator().manual_seed(5)
    lp, _ = _loss_args(gen)
    ref = lp - 0.1 * torch.rand(B, T, generator=gen)
    rewards = torch.zeros(B, T)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    shaped, _ = apply_kl_to_reward(rewards * MASK, lp, ref, MASK, kind="k1", coef=0.5)
    inp = AdvantageInputs(response_mask=MASK, token_rewards=shaped, group_ids=IDS)
    adv, _ = ADV_ESTIMATORS.get("grpo")(inp, AdvantageConfig())
    expected = group_normalized_scores((shaped * MASK).sum(-1), IDS)[:, None]
    assert adv.shape == (B, 1)
    torch.testing.assert_close(adv, expected)
