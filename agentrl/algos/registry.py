"""Registries of RL algorithms: advantage estimators, policy losses and KL penalties.

    ADV_ESTIMATORS.get("grpo")(inputs, AdvantageConfig())  # a typo says "did you mean 'grpo'?"

    @register_advantage("my_adv", description="score minus the batch median")
    def my_adv(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]: ...

Each registry imports its builtin module (``agentrl.algos.advantages``, ``.losses``, ``.kl``)
on first lookup, so listing or getting an id never needs an explicit import. The calling
conventions every registered function follows are the Protocols below.

verl names: every value verl 0.9.1 accepts for ``algorithm.adv_estimator``,
``actor.policy_loss.loss_mode``, ``algorithm.kl_penalty`` / ``actor.kl_loss_type`` and
``actor.loss_agg_mode`` either works here (the same id, or an alias registered next to ours:
``grpo_vectorized`` -> ``grpo``, ``vanilla`` -> ``ppo_clip``, ``kl`` -> ``k1``, ...) or is
refused by :class:`UnknownAlgoError` with a message that names what agentrl has instead.
:func:`canonical_name` maps an alias to the id it stands for (configs compare canonical ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.errors import UnknownIdError
from agentrl.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from agentrl.algos.advantages import AdvantageConfig, AdvantageInputs
    from agentrl.algos.aggregation import Aggregation
    from agentrl.algos.losses import PolicyLossConfig


class AdvantageEstimator(Protocol):
    """``fn(inputs, cfg) -> (advantages, returns)``, each (B, T) and 0 where the mask is 0, or
    (B, 1) for a sequence-level estimator (one value per row, broadcast over the mask)."""

    def __call__(self, inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]: ...


class PolicyLoss(Protocol):
    """``fn(logprobs, old_logprobs, advantages, mask, cfg, *, agg, is_weights) -> (loss, metrics)``."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        cfg: PolicyLossConfig,
        *,
        agg: Aggregation,
        is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


class KLPenalty(Protocol):
    """``fn(logprobs (B, T), ref_logprobs (B, T)) -> per-token KL estimate (B, T)``."""

    def __call__(self, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor: ...


VERL_ALIASES: dict[str, dict[str, str]] = {
    "advantage estimator": {"grpo_vectorized": "grpo", "rloo_vectorized": "rloo"},
    "policy loss": {"vanilla": "ppo_clip"},
    "KL penalty": {"kl": "k1", "kl+": "k1+", "mse+": "k2"},  # verl's mse+ and k2+ are plain k2
}
"""verl 0.9.1 ids that name one of ours under another name: kind -> {verl id: our id}."""

VERL_ONLY: dict[str, dict[str, str]] = {
    "advantage estimator": {
        "opo": "OPO's length-weighted group baseline is not implemented; the closest is dr_grpo",
        "grpo_passk": "the pass@k advantage is not implemented; the closest is grpo",
        "gpg": "GPG is not implemented; the closest is dr_grpo (GPG drops the std as well)",
        "optimal_token_baseline": "per-token optimal baselines are not implemented; "
        "the closest are rloo and grpo",
        "tir_optimal_token_baseline": "per-token optimal baselines are not implemented; "
        "the closest are rloo and grpo",
        "gdpo": "GDPO's per-reward group normalisation is not implemented; the closest is grpo "
        "on the summed reward",
    },
    "policy loss": {
        "dppo_tv": "DPPO is not implemented; the closest is ppo_clip",
        "dppo_kl": "DPPO is not implemented; the closest is ppo_clip",
        "sapo": "SAPO's soft gate is not implemented; the closest is ppo_clip",
        "gpg": "GPG's loss is -A * logp, i.e. cispo with a huge cispo_clip_high",
        "clip_cov": "Clip-Cov is not implemented; the closest is ppo_clip",
        "kl_cov": "KL-Cov is not implemented; the closest is ppo_clip with a KL loss (algo.kl)",
        "geo_mean": "GMPO is not implemented; the closest is gspo (a sequence-level ratio)",
        "dro": "DRO is not implemented",
        "bypass_mode": "bypass mode is not a loss here: use ppo_clip and pass rollout "
        "importance-sampling weights (rollout_is_weights) as is_weights",
    },
    "KL penalty": {
        "full": "the full-vocabulary KL needs logits, and agentrl's losses see token logprobs "
        "(verl raises NotImplementedError for it too); use k3 (verl's low_var_kl)",
        "full+": "the full-vocabulary KL needs logits; use k3+ (verl's low_var_kl+)",
    },
}
"""verl 0.9.1 ids with no counterpart here: kind -> {verl id: what to use instead}."""


class UnknownAlgoError(UnknownIdError):
    """An unknown algorithm id; for one of verl's, the message says what agentrl has instead."""

    def __init__(self, kind: str, key: str, known: Iterable[str], hint: str = "") -> None:
        known = sorted(known)
        super().__init__(kind, key, known, hint)
        note = VERL_ONLY.get(kind, {}).get(key)
        if note is not None:
            self.args = (
                f"{kind} {key!r} is verl's and has no agentrl counterpart: {note}. "
                f"agentrl's are {', '.join(known)}.",
            )


ADV_ESTIMATORS: Registry[Any] = Registry(
    "advantage estimator",
    builtin_modules=("agentrl.algos.advantages",),
    error_cls=UnknownAlgoError,
    hint="Register one with @register_advantage('name').",
)
POLICY_LOSSES: Registry[Any] = Registry(
    "policy loss",
    builtin_modules=("agentrl.algos.losses",),
    error_cls=UnknownAlgoError,
    hint="Register one with @register_policy_loss('name').",
)
KL_PENALTIES: Registry[Any] = Registry(
    "KL penalty",
    builtin_modules=("agentrl.algos.kl",),
    error_cls=UnknownAlgoError,
    hint="Register one with @register_kl('name').",
)


def register_advantage(name: str, *, description: str = "") -> Callable[[Any], Any]:
    """Decorator: register an :class:`AdvantageEstimator` under ``name``."""
    return ADV_ESTIMATORS.decorator(name, description=description)


def register_policy_loss(name: str, *, description: str = "") -> Callable[[Any], Any]:
    """Decorator: register a :class:`PolicyLoss` under ``name``."""
    return POLICY_LOSSES.decorator(name, description=description)


def register_kl(name: str, *, description: str = "") -> Callable[[Any], Any]:
    """Decorator: register a :class:`KLPenalty` under ``name``."""
    return KL_PENALTIES.decorator(name, description=description)


def canonical_name(registry: Registry[Any], name: str) -> str:
    """Our id for ``name`` when it is one of verl's aliases (``grpo_vectorized`` -> ``grpo``),
    else ``name`` unchanged; looking it up is left to the registry."""
    return VERL_ALIASES.get(registry.kind, {}).get(name, name)
