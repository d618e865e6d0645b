"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import statistics

import pytest
import torch

from agentrl.algos import (
    ADV_ESTIMATORS,
    AdvantageConfig,
    AdvantageInputs,
    gae,
    register_advantage,
    token_level,
)
from agentrl.algos.registry import VERL_ALIASES
from agentrl.errors import ConfigError, UnknownIdError

# Group 7 = samples 0, 3, 4 (scores 1, 2, 6); group -3 = samples 1, 2 (0, 1); group 100 = sample 5.
SCORES = torch.tensor([1.0, 0.0, 1.0, 2.0, 6.0, 5.0])
IDS = torch.tensor([7, -3, -3, 7, 7, 100])
MASK = torch.tensor(
    [[1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1], [1, 0, 0], [1, 1, 0]]
)  # holes and a prompt-like leading 0


SEQUENCE_LEVEL = {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"}


def _run(
    name: str, cfg: AdvantageConfig | None = None, **kw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = AdvantageInputs(response_mask=kw.pop("mask", MASK), **kw)
    return ADV_ESTIMATORS.get(name)(inputs, cfg or AdvantageConfig())


def _expect_broadcast(per_sample: list[float]) -> torch.Tensor:
    return torch.tensor(per_sample)[:, None] * MASK.float()


def _dense(adv: torch.Tensor, mask: torch.Tensor = MASK) -> torch.Tensor:
    """A sequence-level estimator's (B, 1) output as masked (B, T) per-token values."""
    assert adv.shape == (mask.shape[0], 1)
    return token_level(adv, mask)


def test_gae_hand_computed_without_holes() -> None:
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.3]]))  # R = 1 everywhere
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    # gamma = lam = 0.5: deltas 0.3, 0.5*0.7-0.6 = -0.25, 0.5*0.6-0.5 = -0.2; c = 0.25
    adv, ret = gae(r, v, m, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.24375, -0.175, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.25625, 0.425, 1.0]]))


def test_gae_skips_env_tokens_in_multi_turn_masks() -> None:
    # Row 0: the generated tokens of the example above, separated by two env tokens whose
    # values/rewards must not leak in. Row 1: the same with no holes, shifted.
    m = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 0, 0, 1, 1, 1]])
    r = torch.tensor([[0.0, 0.0, 9.0, 9.0, 1.0, 0.0], [5.0, 5.0, 5.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 100.0, 100.0, 0.7, 3.0], [8.0, 8.0, 8.0, 0.5, 0.6, 0.7]])
    adv, ret = gae(r, v, m, gamma=0.5, lam=0.5)
    a, g = [-0.24375, -0.175, 0.3], [0.25625, 0.425, 1.0]
    exp_adv = torch.tensor([[a[0], a[1], 0, 0, a[2], 0], [0, 0, 0, *a]])
    exp_ret = torch.tensor([[g[0], g[1], 0, 0, g[2], 0], [0, 0, 0, *g]])
    torch.testing.assert_close(adv, exp_adv)
    torch.testing.assert_close(ret, exp_ret)


def _loop_gae(
    r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE row by row over the generated tokens only, in float64."""
    adv, ret = torch.zeros_like(r), torch.zeros_like(r)
    for i in range(r.shape[0]):
        idx = m[i].nonzero().flatten().tolist()
        a_next, v_next = 0.0, 0.0
        for j in reversed(idx):
            delta = float(r[i, j]) + gamma * v_next - float(v[i, j])
            a_next = delta + gamma * lam * a_next
            v_next = float(v[i, j])
            adv[i, j], ret[i, j] = a_next, a_next + v_next
    return adv, ret


@pytest.mark.parametrize(
    ("gamma", "lam"),
    [(0.99, 0.95), (0.9, 0.5), (0.9, 0.3), (1.0, 1.0), (0.999, 0.999), (0.5, 1.0), (0.0, 0.9)],
)
@pytest.mark.parametrize("t", [7, 40, 150])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_over_holes_matches_a_loop_over_generated_tokens(
    gamma: float, lam: float, t: int, dtype: torch.dtype
) -> None:
    """Every way gae skips holes (a discounted sum that counts them, for lam >= 1/2; packing
    otherwise; float64 work on long horizons) against a plain loop."""
    g = torch.Generator().manual_seed(t)
    m = (torch.rand(5, t, generator=g) > 0.3).double()
    m[0], m[1] = 0.0, 1.0  # no generated token; no holes
    m[2, : t // 2] = 0.0  # a prompt-like lead
    r = torch.randn(5, t, generator=g, dtype=torch.float64)  # nonzero on holes: dropped
    v = torch.randn(5, t, generator=g, dtype=torch.float64) * 3
    adv, ret = gae(r.to(dtype), v.to(dtype), m.to(dtype), gamma=gamma, lam=lam)
    want_adv, want_ret = _loop_gae(r, v, m, gamma, lam)
    tol = 2e-5 if dtype == torch.float32 else 1e-9
    torch.testing.assert_close(adv.double(), want_adv, rtol=tol, atol=tol)
    torch.testing.assert_close(ret.double(), want_ret, rtol=tol, atol=tol)


def test_gae_estimator_whitens_and_needs_values() -> None:
    m = torch.tensor([[1, 1, 0, 1]])
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.1, 0.2, 0.0, 0.3]])
    adv, ret = _run("gae", AdvantageConfig(gamma=1.0, lam=1.0), mask=m, token_rewards=r, values=v)
    raw = [0.9, 0.8, 0.7]
    mu, sd = statistics.mean(raw), statistics.stdev(raw)
    expected = torch.tensor([[(0.9 - mu) / sd, (0.8 - mu) / sd, 0.0, (0.7 - mu) / sd]])
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 1.0]]))
    with pytest.raises(ConfigError, match="values"):
        _run("gae", mask=m, token_rewards=r)


def test_gae_sequence_reward_goes_on_last_generated_token() -> None:
    m = torch.tensor([[1, 0, 1, 0]])
    v = torch.zeros(1, 4)
    adv, _ = _run(
        "gae",
        AdvantageConfig(gamma=0.5, lam=1.0, whiten=False),
        mask=m,
        rewards=torch.tensor([4.0]),
        values=v,
    )
    torch.testing.assert_close(adv, torch.tensor([[2.0, 0.0, 4.0, 0.0]]))


def test_grpo_noncontiguous_groups_and_singleton() -> None:
    eps = 1e-6
    s7, s3 = 7.0**0.5, 0.5**0.5
    per = [
        -2 / (s7 + eps),
        -0.5 / (s3 + eps),
        0.5 / (s3 + eps),
        -1 / (s7 + eps),
        3 / (s7 + eps),
        0.0,
    ]
    adv, ret = _run("grpo", rewards=SCORES, group_ids=IDS)
    torch.testing.assert_close(_dense(adv), _expect_broadcast(per))
    torch.testing.assert_close(ret, adv)


def test_grpo_without_std_and_uniform_group_is_zero() -> None:
    adv, _ = _run("grpo", AdvantageConfig(norm_by_std=False), rewards=SCORES, group_ids=IDS)
    torch.testing.assert_close(_dense(adv), _expect_broadcast([-2, -0.5, 0.5, -1, 3, 0]))
    flat = torch.tensor([1.0, 1.0])
    adv, _ = _run("grpo", mask=torch.ones(2, 2), rewards=flat, group_ids=torch.tensor([4, 4]))
    assert torch.equal(adv, torch.zeros(2, 1))


def test_grpo_scores_from_token_rewards() -> None:
    tok = torch.zeros(6, 3)
    tok[:, 0] = SCORES  # every row has a generated token at position 0 except row 3
    tok[3] = torch.tensor([7.0, 0.0, 2.0])  # position 0 is masked in row 3: only 2.0 counts
    a1, _ = _run("grpo", token_rewards=tok, group_ids=IDS)
    a2, _ = _run("grpo", rewards=SCORES, group_ids=IDS)
    torch.testing.assert_close(a1, a2)


def test_dr_grpo_ignores_std() -> None:
    adv, _ = _run("dr_grpo", AdvantageConfig(norm_by_std=True), rewards=SCORES, group_ids=IDS)
    torch.testing.assert_close(_dense(adv), _expect_broadcast([-2, -0.5, 0.5, -1, 3, 0]))


def test_rloo_leave_one_out() -> None:
    # group 7: 1 - (2+6)/2, 2 - (1+6)/2, 6 - (1+2)/2; group -3: 0 - 1, 1 - 0; singleton: 0
    adv, _ = _run("rloo", rewards=SCORES, group_ids=IDS)
    torch.testing.assert_close(_dense(adv), _expect_broadcast([-3, -1, 1, -1.5, 4.5, 0]))


def test_reinforce_plus_plus_discounted_and_whitened() -> None:
    m = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]])
    r = torch.tensor([[0.0, 7.0, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0]])
    adv, ret = _run("reinforce_plus_plus", AdvantageConfig(gamma=0.5), mask=m, token_rewards=r)
    # row 0 generated rewards 0, 0, 1 -> 0.25, 0.5, 1; row 1: 0, 2 -> 1, 2
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0, 0.5, 1], [1, 2, 0, 0]]))
    vals = [0.25, 0.5, 1.0, 1.0, 2.0]
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    w = [
        [(0.25 - mu) / sd, 0, (0.5 - mu) / sd, (1 - mu) / sd],
        [(1 - mu) / sd, (2 - mu) / sd, 0, 0],
    ]
    torch.testing.assert_close(adv, torch.tensor(w), atol=1e-5, rtol=1e-5)


def test_reinforce_plus_plus_baseline() -> None:
    adv, _ = _run("reinforce_plus_plus_baseline", rewards=SCORES, group_ids=IDS)
    centred = [-2, -0.5, 0.5, -1, 3, 0]
    vals = [centred[i] for i in range(6) for t in range(3) if MASK[i, t]]
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    expected = torch.tensor(
        [[(centred[i] - mu) / sd * float(MASK[i, t]) for t in range(3)] for i in range(6)]
    )
    torch.testing.assert_close(_dense(adv), expected, atol=1e-5, rtol=1e-5)


def test_remax_subtracts_greedy_baseline() -> None:
    m = torch.tensor([[1, 1, 0], [0, 1, 1]])
    adv, ret = _run(
        "remax",
        mask=m,
        rewards=torch.tensor([1.0, 0.0]),
        baseline_rewards=torch.tensor([0.25, 0.5]),
    )
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0], [0, -0.5, -0.5]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0], [0, 0, 0]]))
    with pytest.raises(ConfigError, match="baseline_rewards"):
        _run("remax", mask=m, rewards=torch.tensor([1.0, 0.0]))


def test_group_estimators_need_group_ids_and_good_shapes() -> None:
    with pytest.raises(ConfigError, match="group_ids"):
        _run("grpo", rewards=SCORES)
    with pytest.raises(ConfigError, match=r"\(B,\)"):
        AdvantageInputs(response_mask=MASK, rewards=SCORES[:3])
    with pytest.raises(ConfigError, match="rewards"):
        AdvantageInputs(response_mask=MASK)


def test_registry_lookup_typo_and_user_registration() -> None:
    with pytest.raises(UnknownIdError, match="Did you mean 'grpo'"):
        ADV_ESTIMATORS.get("gpro")

    @register_advantage("test_constant_one")
    def constant(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[torch.Tensor, torch.Tensor]:
        a = inp.mask
        return a, a

    try:
        adv, _ = _run("test_constant_one", rewards=SCORES)
        assert torch.equal(adv, MASK.float())
    finally:
        ADV_ESTIMATORS.unregister("test_constant_one")


@pytest.mark.parametrize(
    "name", sorted(set(ADV_ESTIMATORS.ids()) - set(VERL_ALIASES[ADV_ESTIMATORS.kind]))
)
@pytest.mark.parametrize("holes", [False, True])
def test_estimators_leave_inputs_untouched_and_masked_tokens_zero(name: str, holes: bool) -> None:
    g = torch.Generator().manual_seed(3)
    mask = (torch.arange(130)[None, :] < torch.tensor([[130], [70], [1], [0]])).long()
    if holes:
        mask[:2, 10:20] = 0
    fields = {
        "response_mask": mask,
        "token_rewards": torch.randn(4, 130, generator=g),
        "values": torch.randn(4, 130, generator=g),
        "group_ids": torch.tensor([3, 3, -8, -8]),
        "baseline_rewards": torch.randn(4, generator=g),
    }
    before = {k: v.clone() for k, v in fields.items()}
    values = fields["values"].clone().requires_grad_()
    adv, ret = ADV_ESTIMATORS.get(name)(
        AdvantageInputs(**{**fields, "values": values}), AdvantageConfig(gamma=0.9, lam=0.8)
    )
    for k, v in before.items():
        assert torch.equal(fields[k], v), f"{name} modified {k}"
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    if name in SEQUENCE_LEVEL:  # one value per row, broadcast over the row's mask-1 tokens
        assert adv.shape == ret.shape == (4, 1)
        adv, ret = token_level(adv, mask), token_level(ret, mask)
    else:
        assert adv.shape == ret.shape == (4, 130)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
