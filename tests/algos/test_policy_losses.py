"""Policy losses, value loss and entropy bonus against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import POLICY_LOSSES, Aggregation, PolicyLossConfig, entropy_loss, value_loss
from agentrl.errors import ConfigError

TOKEN_MEAN = Aggregation(mode="token-mean")
# ratios r and advantages A per token; the last token is masked out
R = [1.1, 1.5, 0.5, 5.0, 0.5]
A = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0]])
M = torch.tensor([[1, 1, 1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])


def _logprobs() -> torch.Tensor:
    return (OLD + torch.log(torch.tensor([R]))).requires_grad_()


def test_ppo_clip_dual_clip_hand_computed() -> None:
    lp = _logprobs()
    loss, met = POLICY_LOSSES.get("ppo_clip")(lp, OLD, A, M, PolicyLossConfig(), agg=TOKEN_MEAN)
    # per token: -1.1 (inside), -1.2 (clipped at 1.2), 0.8 (clipped at 0.8), min(5, 3) = 3 (dual)
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 0.8 + 3.0) / 4)
    assert met["pg_clipfrac"].item() == pytest.approx(2 / 4)
    assert met["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)
    assert met["ppo_kl"].item() == pytest.approx(-sum(math.log(r) for r in R[:4]) / 4)
    loss.backward()
    assert lp.grad is not None
    # d/dlogp of -A r is -A r; clipped tokens and the dual-clipped token have no gradient
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.1 / 4, 0.0, 0.0, 0.0, 0.0]]))


def test_ppo_clip_higher_and_no_dual_clip() -> None:
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None)
    loss, met = POLICY_LOSSES.get("ppo_clip")(_logprobs(), OLD, A, M, cfg, agg=TOKEN_MEAN)
    assert loss.item() == pytest.approx((-1.1 - 1.28 + 0.8 + 5.0) / 4)
    assert met["pg_clipfrac_lower"].item() == 0.0


def test_ppo_importance_weights_scale_tokens() -> None:
    w = torch.tensor([[2.0, 1.0, 1.0, 0.0, 1.0]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(
        _logprobs(), OLD, A, M, PolicyLossConfig(), agg=TOKEN_MEAN, is_weights=w
    )
    assert loss.item() == pytest.approx((-2.2 - 1.2 + 0.8 + 0.0) / 4)


def test_dual_clip_bound_must_exceed_one() -> None:
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        PolicyLossConfig(clip_ratio_c=0.5)


def test_gspo_sequence_ratio_and_gradient_match_sequence_formula() -> None:
    old = torch.tensor([[-1.0, -1.0, -2.0], [-0.5, -0.7, -0.9]])
    delta = torch.tensor([[0.1, 0.3, 9.0], [0.2, -5.0, 0.0]])  # masked tokens carry junk
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    cfg = PolicyLossConfig(gspo_clip_low=0.5, gspo_clip_high=0.5)  # wide: nothing clipped
    lp = (old + delta).requires_grad_()
    loss, met = POLICY_LOSSES.get("gspo")(
        lp, old, adv, mask, cfg, agg=Aggregation(mode="seq-mean-token-mean")
    )
    s = [math.exp(0.2), math.exp(0.1)]  # geometric means of the token ratios
    assert loss.item() == pytest.approx((-1.0 * s[0] + 2.0 * s[1]) / 2)
    assert met["pg_clipfrac"].item() == 0.0
    loss.backward()
    # GSPO sequence objective: -(1/B) sum_i A_i exp(mean_t m (lp - old))
    lp2 = (old + delta).requires_grad_()
    m = mask.float()
    seq = ((lp2 - old) * m).sum(-1) / m.sum(-1)
    (-(adv[:, 0] * seq.exp()).mean()).backward()
    torch.testing.assert_close(lp.grad, lp2.grad)


def test_gspo_clips_whole_sequences() -> None:
    old = torch.zeros(1, 2)
    lp = torch.tensor([[0.1, 0.3]])
    adv = torch.ones(1, 2)
    loss, met = POLICY_LOSSES.get("gspo")(
        lp, old, adv, torch.ones(1, 2), PolicyLossConfig(), agg=TOKEN_MEAN
    )
    assert loss.item() == pytest.approx(-(1 + 4e-4))
    assert met["pg_clipfrac"].item() == 1.0


def test_cispo_stop_gradient_weight() -> None:
    lp = _logprobs()
    cfg = PolicyLossConfig(cispo_clip_high=0.28)
    loss, met = POLICY_LOSSES.get("cispo")(lp, OLD, A, M, cfg, agg=TOKEN_MEAN)
    w = [1.1, 1.28, 0.5, 1.28]  # no lower bound by default; upper at 1.28
    lp_vals = lp.detach()[0].tolist()
    expected = sum(-w[i] * A[0, i].item() * lp_vals[i] for i in range(4)) / 4
    assert loss.item() == pytest.approx(expected)
    assert met["pg_clipfrac"].item() == pytest.approx(2 / 4)
    loss.backward()
    # gradient is -w A / N on every token, clipped ones included (the weight is a constant)
    torch.testing.assert_close(
        lp.grad, torch.tensor([[-1.1 / 4, -1.28 / 4, 0.5 / 4, 1.28 / 4, 0.0]])
    )


def test_cispo_lower_bound() -> None:
    cfg = PolicyLossConfig(cispo_clip_low=0.2)
    lp = _logprobs()
    loss, met = POLICY_LOSSES.get("cispo")(lp, OLD, A, M, cfg, agg=TOKEN_MEAN)
    loss.backward()
    assert lp.grad is not None
    assert lp.grad[0, 2].item() == pytest.approx(0.8 / 4)
    assert met["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)


def test_value_loss_clipped() -> None:
    v = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0]])
    ret = torch.tensor([[1.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, met = value_loss(v, old, ret, mask, clip=0.2, agg=TOKEN_MEAN)
    # t0: max((1-1.5)^2, (0.7-1.5)^2) = 0.64; t1: max(4, 0.49) = 4
    assert loss.item() == pytest.approx(0.5 * (0.64 + 4.0) / 2)
    assert met["vf_clipfrac"].item() == pytest.approx(0.5)
    loss.backward()
    assert v.grad is not None
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 2.0 / 2, 0.0]]))
    unclipped, _ = value_loss(v, old, ret, mask, clip=None, agg=TOKEN_MEAN)
    assert unclipped.item() == pytest.approx(0.5 * (0.25 + 4.0) / 2)


def test_entropy_bonus() -> None:
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    loss, met = entropy_loss(ent, torch.tensor([[1, 1, 0]]), coef=0.01, agg=TOKEN_MEAN)
    assert loss.item() == pytest.approx(-0.02)
    assert met["entropy"].item() == pytest.approx(2.0)


def test_shape_mismatch_is_config_error() -> None:
    with pytest.raises(ConfigError, match="advantages"):
        POLICY_LOSSES.get("ppo_clip")(OLD, OLD, A[:, :2], M, PolicyLossConfig(), agg=TOKEN_MEAN)


@pytest.mark.parametrize("clip_c", [3.0, None])
def test_ppo_clip_matches_textbook_formula_on_random_tokens(clip_c: float | None) -> None:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 50, generator=g, dtype=torch.float64) * 3
    delta = torch.randn(8, 50, generator=g, dtype=torch.float64)
    adv = torch.randn(8, 50, generator=g, dtype=torch.float64)
    mask = (torch.rand(8, 50, generator=g) > 0.3).double()
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=clip_c)
    lp = (old + delta).requires_grad_()
    loss, met = POLICY_LOSSES.get("ppo_clip")(lp, old, adv, mask, cfg, agg=TOKEN_MEAN)
    loss.backward()
    lp2 = (old + delta).requires_grad_()
    r = torch.exp(lp2 - old)
    l1, l2 = -adv * r, -adv * r.clamp(0.8, 1.28)
    ref = torch.maximum(l1, l2)
    if clip_c is not None:
        ref = torch.where(adv < 0, torch.minimum(ref, -adv * clip_c), ref)
    ref_loss = (ref * mask).sum() / mask.sum()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(lp.grad, lp2.grad)
    assert met["pg_clipfrac"].item() == pytest.approx(
        ((l2 > l1).double() * mask).sum().item() / mask.sum().item()
    )
