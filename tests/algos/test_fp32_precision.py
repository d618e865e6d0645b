"""Every advantage estimator in float32 stays within 1e-5 of itself run on float64 inputs.

The measure is the largest absolute difference over mask-1 tokens. The whitened estimators
(gae, reinforce_plus_plus) used to lose it in one float32 dot product over the whole batch
(reinforce_plus_plus of a sequence score: 3.7e-5 at 128 x 2048, 6.8e-4 at 1024 x 8192), and
the blocked scan let the rounding errors of its blocks add up along a row.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import ADV_ESTIMATORS, AdvantageConfig, AdvantageInputs, token_level
from agentrl.algos.aggregation import masked_moments, masked_var, masked_whiten

BOUND = 1e-5
BUILTIN = [
    "gae",
    "reinforce_plus_plus",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
    "remax",
]


def _inputs(b: int, t: int, dtype: torch.dtype, *, dense: bool) -> AdvantageInputs:
    """A seeded batch with multi-turn holes: a sequence score, or (B, T) token rewards."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    pos = torch.arange(t)
    holes = (pos[None, :] + torch.randint(0, 64, (b, 1), generator=g)) % 256 < 32
    mask = (pos[None, :] < lengths[:, None]) & ~holes
    scores = torch.randint(0, 3, (b,), generator=g).to(dtype)
    # score - coef * KL on every token, as apply_kl_to_reward leaves them
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    kl = torch.randn(b, t, generator=g).abs() * 0.01
    token_rewards = (torch.where(last, scores.double()[:, None], 0.0) - kl).to(dtype)
    return AdvantageInputs(
        response_mask=mask.float(),
        rewards=None if dense else scores,
        token_rewards=token_rewards if dense else None,
        values=torch.randn(b, t, generator=g).to(dtype),
        group_ids=torch.arange(b) // 8,
        baseline_rewards=torch.randint(0, 3, (b,), generator=g).to(dtype),
    )


def _error(name: str, b: int, t: int, *, dense: bool, gamma: float, lam: float) -> float:
    cfg = AdvantageConfig(gamma=gamma, lam=lam)
    out = []
    for dtype in (torch.float32, torch.float64):
        inp = _inputs(b, t, dtype, dense=dense)
        adv, _ = ADV_ESTIMATORS.get(name)(inp, cfg)
        out.append(token_level(adv, inp.response_mask).double())
    return float((out[0] - out[1]).abs().max())


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("dense", [False, True], ids=["score", "token_rewards"])
def test_fp32_estimators_match_fp64(name: str, dense: bool) -> None:
    assert _error(name, 128, 2048, dense=dense, gamma=0.99, lam=0.95) < BOUND


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("dense", [False, True], ids=["score", "token_rewards"])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_fp32_estimators_match_fp64_full_size(
    name: str, dense: bool, gamma: float, lam: float
) -> None:
    assert _error(name, 1024, 8192, dense=dense, gamma=gamma, lam=lam) < BOUND


def test_moments_are_float64_accurate() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 5000, generator=g) * 3 + 100  # mean far from 0: cancellation-prone
    m = torch.rand(300, 5000, generator=g) > 0.3
    n, mean, m2 = masked_moments(x, m)
    ref = x.double()[m]
    assert int(n) == ref.numel()
    assert abs(float(mean) / float(ref.mean()) - 1) < 1e-8
    assert abs(float(m2) / float(((ref - ref.mean()) ** 2).sum()) - 1) < 1e-7
    assert abs(float(masked_var(x, m)) / float(ref.var()) - 1) < 1e-6


def test_whiten_is_zero_off_mask_and_unit_on_it() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 700, generator=g) * 5 + 2
    m = torch.rand(40, 700, generator=g) > 0.5
    w = masked_whiten(x, m)
    assert bool((w[~m] == 0).all())
    assert abs(float(w[m].double().mean())) < 1e-6
    assert abs(float(w[m].double().var()) - 1) < 1e-5
    scale_only = masked_whiten(x.clone(), m, shift_mean=False, inplace=True)
    torch.testing.assert_close(scale_only[m] - w[m], torch.full_like(w[m], float(x[m].mean())))
