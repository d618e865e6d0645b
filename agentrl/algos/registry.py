"""Registries of RL algorithms: advantage estimators, policy losses and KL penalties.

    ADV_ESTIMATORS.get("grpo")(inputs, AdvantageConfig())  # a typo says "did you mean 'grpo'?"

    @register_advantage("my_adv", description="score minus the batch median")
    def my_adv(inp: AdvantageInputs, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]: ...

Each registry imports its builtin module (``agentrl.algos.advantages``, ``.losses``, ``.kl``)
on first lookup, so listing or getting an id never needs an explicit import. The calling
conventions every registered function follows are the Protocols below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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


ADV_ESTIMATORS: Registry[Any] = Registry(
    "advantage estimator",
    builtin_modules=("agentrl.algos.advantages",),
    hint="Register one with @register_advantage('name').",
)
POLICY_LOSSES: Registry[Any] = Registry(
    "policy loss",
    builtin_modules=("agentrl.algos.losses",),
    hint="Register one with @register_policy_loss('name').",
)
KL_PENALTIES: Registry[Any] = Registry(
    "KL penalty",
    builtin_modules=("agentrl.algos.kl",),
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
