"""KL estimators, straight-through gradients, KL-in-reward and KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import (
    KL_PENALTIES,
    AdaptiveKLController,
    Aggregation,
    FixedKLController,
    apply_kl_to_reward,
    kl_loss,
    kl_penalty,
)
from agentrl.errors import ConfigError, UnknownIdError

D = 0.5  # logprob - ref_logprob
K3 = math.exp(-D) + D - 1


@pytest.mark.parametrize(
    ("kind", "value", "grad"),
    [
        ("k1", D, 1.0),
        ("abs", D, 1.0),
        ("k2", D * D / 2, D),
        ("mse", D * D / 2, D),
        ("k3", K3, 1 - math.exp(-D)),
        ("low_var_kl", K3, 1 - math.exp(-D)),
        ("k1+", D, D),  # straight-through: value of k1, gradient of k2
        ("k3+", K3, D),
        ("low_var_kl+", K3, D),
        ("abs+", D, D),
        ("k2+", D * D / 2, D),
    ],
)
def test_estimator_value_and_gradient(kind: str, value: float, grad: float) -> None:
    lp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5]])
    kl = kl_penalty(lp, ref, kind)
    assert kl.item() == pytest.approx(value)
    kl.sum().backward()
    assert lp.grad is not None
    assert lp.grad.item() == pytest.approx(grad)


def test_k3_is_finite_for_huge_log_ratios() -> None:
    kl = kl_penalty(torch.tensor([[-100.0, 0.0]]), torch.tensor([[0.0, -100.0]]), "k3")
    assert torch.isfinite(kl).all()
    assert kl[0, 0].item() == 10.0


def test_kl_loss_aggregates_over_mask() -> None:
    lp = torch.tensor([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -2.0, -9.0]])
    loss, met = kl_loss(lp, ref, torch.tensor([[1, 1, 0]]), "k1", agg=Aggregation())
    assert loss.item() == pytest.approx((0.5 + 1.0) / 2)
    assert met["kl_loss"].item() == pytest.approx(0.75)


def test_apply_kl_to_reward() -> None:
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    lp = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5, -2.0, -5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    new_r, met = apply_kl_to_reward(r, lp, ref, mask, kind="k1", coef=0.1)
    torch.testing.assert_close(new_r, torch.tensor([[-0.05, 0.05, 0.9, 0.0]]))
    assert not new_r.requires_grad
    assert met["kl"].item() == pytest.approx((0.5 - 0.5 + 1.0) / 3)


def test_unknown_kl_kind() -> None:
    with pytest.raises(UnknownIdError, match="Did you mean"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "lowvar_kl")
    assert "k3+" in KL_PENALTIES


def test_adaptive_controller_moves_towards_target() -> None:
    c = AdaptiveKLController(value=0.1, target=1.0, horizon=10)
    c.update(current_kl=2.0, n_steps=5)  # error clipped to +0.2 -> x(1 + 0.2 * 5/10)
    assert c.value == pytest.approx(0.11)
    c.update(current_kl=0.9, n_steps=10)  # error -0.1 -> x0.9
    assert c.value == pytest.approx(0.099)
    f = FixedKLController(value=0.05)
    f.update(current_kl=100.0, n_steps=10)
    assert f.value == 0.05
    with pytest.raises(ConfigError):
        AdaptiveKLController(target=0.0)
