"""Every value verl 0.9.1 accepts for an algorithm name works here or is refused naming ours.

The lists are verl 0.9.1's (verl/trainer/ppo/core_algos.py: the AdvantageEstimator enum, the
register_policy_loss names, kl_penalty_forward's branches with the optional '+', and
ActorConfig's valid_loss_agg_modes).
"""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import ADV_ESTIMATORS, KL_PENALTIES, POLICY_LOSSES, Aggregation
from agentrl.algos.aggregation import parse_agg_mode
from agentrl.algos.registry import VERL_ALIASES, VERL_ONLY, canonical_name
from agentrl.errors import ConfigError, UnknownIdError
from agentrl.registry import Registry

VERL_ADV_ESTIMATORS = [
    "gae",
    "grpo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "opo",
    "grpo_passk",
    "gpg",
    "rloo_vectorized",
    "grpo_vectorized",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "gdpo",
]
VERL_POLICY_LOSSES = [
    "vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
    "bypass_mode",
]
_KL_BASE = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]
VERL_KL = _KL_BASE + [f"{k}+" for k in _KL_BASE]
VERL_AGG_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]

CASES = [
    *[(ADV_ESTIMATORS, n) for n in VERL_ADV_ESTIMATORS],
    *[(POLICY_LOSSES, n) for n in VERL_POLICY_LOSSES],
    *[(KL_PENALTIES, n) for n in VERL_KL],
]


@pytest.mark.parametrize(("registry", "name"), CASES, ids=[f"{r.kind}:{n}" for r, n in CASES])
def test_verl_name_is_ours_an_alias_or_refused_naming_ours(
    registry: Registry[object], name: str
) -> None:
    refused = VERL_ONLY.get(registry.kind, {})
    if name in refused:
        with pytest.raises(UnknownIdError) as info:
            registry.get(name)
        msg = str(info.value)
        assert "verl's" in msg and refused[name] in msg
        assert all(
            ours in msg for ours in registry.ids() if ours not in VERL_ALIASES[registry.kind]
        )
        return
    fn = registry.get(name)
    ours = canonical_name(registry, name)
    assert ours in registry and registry.get(ours) is fn
    assert ours == VERL_ALIASES[registry.kind].get(name, name)


def test_every_alias_and_refusal_is_a_verl_name() -> None:
    verl = {
        "advantage estimator": VERL_ADV_ESTIMATORS,
        "policy loss": VERL_POLICY_LOSSES,
        "KL penalty": VERL_KL,
    }
    for kind, names in verl.items():
        assert set(VERL_ALIASES[kind]) | set(VERL_ONLY[kind]) <= set(names)


def test_kl_aliases_compute_verls_estimators() -> None:
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    d = lp - ref
    torch.testing.assert_close(KL_PENALTIES.get("kl")(lp, ref), d)
    torch.testing.assert_close(KL_PENALTIES.get("mse+")(lp, ref), 0.5 * d.square())
    torch.testing.assert_close(KL_PENALTIES.get("kl+")(lp, ref), d)  # value of k1
    x = lp.clone().requires_grad_()
    KL_PENALTIES.get("kl+")(x, ref).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, d)  # gradient of k2


@pytest.mark.parametrize("mode", VERL_AGG_MODES)
def test_verl_loss_agg_modes(mode: str) -> None:
    if mode == "token-sum":
        with pytest.raises(ConfigError, match="seq-mean-token-sum"):
            Aggregation(mode=mode)
    else:
        assert parse_agg_mode(mode) == mode


def test_run_config_takes_verl_names_as_ours() -> None:
    from trainers.config import load_run_config

    env = "data.envs=[{id: arith/Calculator-v0}]"
    cfg = load_run_config(
        None,
        [
            env,
            "algo.adv_estimator=rloo_vectorized",
            "algo.policy_loss=vanilla",
            "algo.kl.type=kl",
            "algo.kl.coef=0.001",
        ],
    )
    assert (cfg.algo.adv_estimator, cfg.algo.policy_loss, cfg.algo.kl.type) == (
        "rloo",
        "ppo_clip",
        "k1",
    )
    with pytest.raises(ConfigError, match="group_size"):  # an alias gets our checks too
        load_run_config(None, [env, "algo.adv_estimator=grpo_vectorized", "rollout.group_size=1"])
    with pytest.raises(UnknownIdError, match="ppo_clip"):
        load_run_config(None, [env, "algo.policy_loss=sapo"])
