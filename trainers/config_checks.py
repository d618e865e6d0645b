"""The cross-section checks of a run config (``RunConfig.validate``).

Each check raises ``ConfigError`` with what was expected and a setting that works. A
section's own checks (``InferenceConfig.validate``, ``CollectorConfig.validate``, ...) stay
with the section; what spans sections (batch shapes against the world size, algorithm names
against the registries, the training mode against the algorithm) is here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from agentrl.errors import ConfigError
from agentrl.splits import check_fraction

if TYPE_CHECKING:
    from trainers.config import RunConfig


def check_run_config(cfg: RunConfig) -> None:
    """All of this module's checks, in order (algorithm names are made canonical first)."""
    _canonical_algo_names(cfg)
    _validate_shapes(cfg)
    _validate_names(cfg)
    _validate_algo_options(cfg)
    _validate_mode(cfg)


def _validate_shapes(cfg: RunConfig) -> None:
    if not cfg.data.envs:
        raise ConfigError("data.envs is empty; add one, e.g. data.envs=[{id: arith/Calculator-v0}]")
    check_fraction(cfg.data.eval_fraction)
    t, r = cfg.train, cfg.rollout
    r.validate()
    for key, v in (
        ("train.steps", t.steps),
        ("train.batch_size", t.batch_size),
        ("train.ppo_epochs", t.ppo_epochs),
        ("train.world_size", t.world_size),
        ("inference.num_servers", cfg.inference.num_servers),
    ):
        if v < 1:
            raise ConfigError(f"{key} must be >= 1, got {v}")
    if t.mini_batch_size and t.batch_size % t.mini_batch_size:
        m = t.mini_batch_size
        raise ConfigError(
            f"train.batch_size ({t.batch_size}) must be a multiple of train.mini_batch_size ({m}); "
            f"try train.batch_size={m * math.ceil(t.batch_size / m)}."
        )
    if cfg.algo.adv_estimator in _GROUP_ESTIMATORS and r.group_size < 2:
        raise ConfigError(
            f"rollout.group_size must be >= 2 for algo.adv_estimator={cfg.algo.adv_estimator} "
            "(the baseline comes from the other group members); try rollout.group_size=8."
        )
    for backend in sorted(cfg.backends_in_use()):
        options = cfg.engine_options(backend)
        if options is not None and hasattr(options, "validate_run"):
            options.validate_run(cfg)
    seqs = (t.mini_batch_size or t.batch_size) * r.group_size
    if seqs < t.world_size:
        raise ConfigError(
            f"a mini-batch holds {seqs} sequences, fewer than train.world_size={t.world_size} ranks; "
            "raise train.mini_batch_size or rollout.group_size."
        )
    cfg.inference.validate()
    if not 0.0 <= t.max_error_rate < 1.0:
        raise ConfigError(
            f"train.max_error_rate must be in [0, 1), got {t.max_error_rate}; e.g. 0.5 warns "
            "when more than half of a step's rollouts failed"
        )
    if cfg.sft.prompt_loss_weight < 0:
        raise ConfigError(
            f"sft.prompt_loss_weight must be >= 0 (0: train on the targets only), got "
            f"{cfg.sft.prompt_loss_weight}"
        )
    if cfg.sft.prompt_loss_weight and cfg.engine.backend != "torch":
        raise ConfigError(
            "sft.prompt_loss_weight is built and tested for engine.backend=torch only; set it "
            "to 0 or train with the torch engine"
        )
    if cfg.model.tiny.corpus_demos < 0:
        raise ConfigError(
            f"model.tiny.corpus_demos must be >= 0 (0: the tokenizer's built-in corpus only), "
            f"got {cfg.model.tiny.corpus_demos}"
        )
    if cfg.sft.steps and cfg.sft.batch_size < t.world_size:
        raise ConfigError(
            f"sft.batch_size ({cfg.sft.batch_size}) must be >= train.world_size ({t.world_size})"
        )


_GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline")


def _canonical_algo_names(cfg: RunConfig) -> None:
    """verl's names for our algorithms (grpo_vectorized, vanilla, kl, ...) -> our ids, so
    checks like ``adv_estimator == "gae"`` see one name; unknown names are left to
    :func:`_validate_names`."""
    from agentrl.algos import ADV_ESTIMATORS, KL_PENALTIES, POLICY_LOSSES
    from agentrl.algos.registry import canonical_name

    cfg.algo.adv_estimator = canonical_name(ADV_ESTIMATORS, cfg.algo.adv_estimator)
    cfg.algo.policy_loss = canonical_name(POLICY_LOSSES, cfg.algo.policy_loss)
    cfg.algo.kl.type = canonical_name(KL_PENALTIES, cfg.algo.kl.type)


def _validate_names(cfg: RunConfig) -> None:
    """Registry names resolve (each registry raises UnknownIdError with 'did you mean')."""
    from agentrl.agent import AGENTS
    from agentrl.algos import ADV_ESTIMATORS, KL_PENALTIES, POLICY_LOSSES
    from agentrl.algos.aggregation import parse_agg_mode
    from agentrl.env import ENVS
    from agentrl.registry import import_modules
    from trainers.engines import ENGINES

    import_modules(cfg.modules, key="modules:")
    AGENTS.get(cfg.rollout.agent)  # imported now: a duplicate registration fails here, once
    ENGINES.spec(cfg.engine.backend)
    if cfg.algo.adv_estimator == "gae":
        ENGINES.spec(cfg.critic.backend)
    ADV_ESTIMATORS.spec(cfg.algo.adv_estimator)
    POLICY_LOSSES.spec(cfg.algo.policy_loss)
    if cfg.algo.kl.coef:
        KL_PENALTIES.spec(cfg.algo.kl.type)
    parse_agg_mode(cfg.algo.loss_agg)
    for entry in cfg.data.envs:
        ENVS.spec(entry.id)
    cfg.engine.validate()
    if cfg.algo.adv_estimator == "gae":
        cfg.critic.validate()


def _validate_algo_options(cfg: RunConfig) -> None:
    """KL controller, rollout IS correction, overlong filter/penalty."""
    kl, is_, ol = cfg.algo.kl, cfg.algo.rollout_is, cfg.algo.overlong
    if kl.controller not in ("fixed", "adaptive"):
        raise ConfigError(f"algo.kl.controller must be fixed or adaptive, got {kl.controller!r}")
    if kl.controller == "adaptive":
        if kl.coef <= 0:
            raise ConfigError(
                "algo.kl.controller=adaptive needs an initial algo.kl.coef > 0 (it also turns on "
                f"the reference model), got {kl.coef}; try algo.kl.coef=0.001"
            )
        if kl.target <= 0 or kl.horizon <= 0:
            raise ConfigError(
                f"algo.kl.target ({kl.target}) and algo.kl.horizon ({kl.horizon}) must be > 0 "
                "with algo.kl.controller=adaptive; try algo.kl.target=0.1 algo.kl.horizon=10000"
            )
    if is_.enabled:
        if is_.level not in ("token", "sequence"):
            raise ConfigError(f"algo.rollout_is.level must be token or sequence, got {is_.level!r}")
        if not is_.cap > 0:
            raise ConfigError(f"algo.rollout_is.cap must be > 0, got {is_.cap}; try 2.0")
    if ol.penalty:
        if ol.max_len <= 0:
            raise ConfigError(
                "algo.overlong.penalty=true needs algo.overlong.max_len > 0 (generated tokens "
                f"that earn the full penalty), got {ol.max_len}; try algo.overlong.max_len="
                f"{cfg.rollout.max_new_tokens * cfg.rollout.max_turns}"
            )
        if not 0 < ol.cache_len <= ol.max_len:
            raise ConfigError(
                f"algo.overlong.cache_len must be in (0, algo.overlong.max_len={ol.max_len}], got "
                f"{ol.cache_len}; try algo.overlong.cache_len={max(1, ol.max_len // 4)}"
            )


TRAIN_MODES = ("sync", "one_step_off", "async")


def _validate_mode(cfg: RunConfig) -> None:
    """``train.mode`` and ``train.max_staleness``, and what the overlapped modes lack yet."""
    t = cfg.train
    if t.mode not in TRAIN_MODES:
        raise ConfigError(f"train.mode must be one of {', '.join(TRAIN_MODES)}, got {t.mode!r}")
    if t.mode == "async":
        if t.max_staleness is None:
            raise ConfigError(
                "train.mode=async needs train.max_staleness (weight versions a trained token may "
                "lag the policy); try train.max_staleness=2, or 0 for sync-equivalent training"
            )
        if t.max_staleness < 0:
            raise ConfigError(f"train.max_staleness must be >= 0, got {t.max_staleness}")
    elif t.max_staleness is not None:
        fixed = "is always 0" if t.mode == "sync" else "is always 1"
        raise ConfigError(
            f"train.max_staleness ({t.max_staleness}) is only for train.mode=async; with "
            f"train.mode={t.mode} staleness {fixed}. Drop it, or set train.mode=async."
        )
    if t.mode == "sync":
        return
    if cfg.algo.adv_estimator == "remax":
        raise ConfigError(
            f"algo.adv_estimator=remax is not built for train.mode={t.mode} yet (only "
            "train.mode=sync); see docs/guides/async.md"
        )
    if cfg.algo.filter_groups and cfg.algo.max_filter_rounds < 1:
        raise ConfigError(
            f"algo.filter_groups with train.mode={t.mode} needs algo.max_filter_rounds >= 1 "
            f"(got {cfg.algo.max_filter_rounds}): each step's samples are a block of "
            "max_filter_rounds x train.batch_size fixed ahead of time; try 4"
        )
