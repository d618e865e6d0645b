"""RL algorithms as pure, vectorised tensor functions in registries.

    AdvantageInputs --ADV_ESTIMATORS--> advantages, returns: (B, T), or (B, 1) per row
    logprobs, old_logprobs, advantages --POLICY_LOSSES--> loss, metrics
    logprobs, ref_logprobs --KL_PENALTIES--> per-token KL (as a loss or in the reward)

Shapes: token-level tensors are (B, T) with a mask that is 1 on generated tokens (0 on prompt,
environment and padding tokens); sequence-level tensors are (B,), or (B, 1) where they broadcast against (B, T) tensors (the
advantages of grpo, dr_grpo, rloo and reinforce_plus_plus_baseline); GRPO groups are an integer
``group_ids`` (B,) with arbitrary ids. See docs/guides/algorithms.md.
"""

from agentrl.algos.advantages import (
    AdvantageConfig,
    AdvantageInputs,
    gae,
    group_normalized_scores,
    leave_one_out_scores,
    token_level,
)
from agentrl.algos.aggregation import (
    AggMode,
    Aggregation,
    agg_loss,
    masked_mean,
    masked_var,
    masked_whiten,
)
from agentrl.algos.correction import ISCorrectionConfig, ISLevel, rollout_is_weights
from agentrl.algos.filters import (
    DynamicSampler,
    group_has_signal,
    nonuniform_groups,
    overlong_filter_mask,
    overlong_penalty,
)
from agentrl.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_to_reward,
    kl_loss,
    kl_penalty,
)
from agentrl.algos.losses import PolicyLossConfig, entropy_loss, value_loss
from agentrl.algos.ops import discounted_reverse_cumsum, masked_discounted_returns
from agentrl.algos.registry import (
    ADV_ESTIMATORS,
    KL_PENALTIES,
    POLICY_LOSSES,
    AdvantageEstimator,
    KLPenalty,
    PolicyLoss,
    register_advantage,
    register_kl,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATORS",
    "KL_PENALTIES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AggMode",
    "Aggregation",
    "DynamicSampler",
    "FixedKLController",
    "ISCorrectionConfig",
    "ISLevel",
    "KLPenalty",
    "PolicyLoss",
    "PolicyLossConfig",
    "agg_loss",
    "apply_kl_to_reward",
    "discounted_reverse_cumsum",
    "entropy_loss",
    "gae",
    "group_has_signal",
    "group_normalized_scores",
    "kl_loss",
    "kl_penalty",
    "leave_one_out_scores",
    "masked_discounted_returns",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "nonuniform_groups",
    "overlong_filter_mask",
    "overlong_penalty",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
    "rollout_is_weights",
    "token_level",
    "value_loss",
]
