"""The update step every trained role shares: losses as plain objects, one epoch loop.

    run_epochs(engine, batch, PolicyLoss(spec), epochs=2, num_mini_batches=4, prefix="train")
        for each epoch, for each mini-batch:
            engine.forward_backward(mini, loss)   # the engine micro-batches and calls loss(...)
            engine.optimizer_step()               # skipped by the engine when the gradient is 0
        -> the mean of the steps' metrics, the optimizer step count, the first step's PPO KL

The actor (``PolicyLoss``), the critic (``CriticLoss``) and SFT (``NllLoss``) all go through
``run_epochs``. A loss is a small frozen dataclass built in the worker from the picklable
update spec, not a closure: it can be named in a traceback, compared and tested on its own.
Every loss is normalised by the global token or row count (``MicroBatch.global_num_*``), so
the sum over micro-batches and ranks is the exact global mean.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from agentrl.algos import POLICY_LOSSES, Aggregation, PolicyLossConfig, entropy_loss, kl_loss
from agentrl.algos.aggregation import AggMode, masked_mean
from agentrl.algos.losses import value_loss
from agentrl.batch import TrainBatch
from agentrl.engine import Engine, LossFn, MicroBatch
from agentrl.logging import mean_metrics

logger = logging.getLogger(__name__)

Metrics = dict[str, float]
LossMetrics = Mapping[str, float | torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class PolicyUpdate:
    """What one policy update needs to know (sent to every actor rank)."""

    loss: str = "ppo_clip"
    loss_cfg: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    agg: str = AggMode.TOKEN_MEAN
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    """KL-as-loss coefficient (needs a ``ref_logprobs`` field); 0 disables it."""
    kl_type: str = "k3"
    epochs: int = 1
    num_mini_batches: int = 1
    temperature: float = 1.0
    is_weights: bool = False
    """Multiply the per-token policy loss by the batch's ``is_weights`` (rollout IS correction)."""


@dataclass(frozen=True, kw_only=True)
class CriticUpdate:
    value_clip: float | None = 0.2
    agg: str = AggMode.TOKEN_MEAN
    epochs: int = 1
    num_mini_batches: int = 1


def aggregation(mode: str, mb: MicroBatch) -> Aggregation:
    """Normalise by the global count so summed micro-batch losses are the exact global mean."""
    n = mb.global_num_loss_tokens if mode == AggMode.TOKEN_MEAN else mb.global_num_rows
    return Aggregation(mode=mode, normaliser=max(float(n), 1.0))


def summed(x: torch.Tensor, mb: MicroBatch) -> float:
    """A partial (globally normalised) loss, scaled so the engine's mean over pieces is its sum."""
    return float(x) * mb.count * mb.dp_size


@dataclass(frozen=True)
class PolicyLoss:
    """The actor's loss: the registered policy loss, plus entropy and KL-to-reference terms.

    Needs fields ``old_logprobs`` and ``advantages`` ((B, T), or (B, 1) from a sequence-level
    estimator, broadcast over ``loss_mask``), ``ref_logprobs`` with a KL coefficient and
    ``is_weights`` (B, T) with ``spec.is_weights``.
    """

    spec: PolicyUpdate

    def __call__(
        self,
        logprobs: torch.Tensor | None,
        entropy: torch.Tensor | None,
        values: torch.Tensor | None,
        mb: MicroBatch,
        /,
    ) -> tuple[torch.Tensor, LossMetrics]:
        assert logprobs is not None, "PolicyLoss needs logprobs (an actor engine)"
        spec, b = self.spec, mb.batch
        agg, mask = aggregation(spec.agg, mb), b.loss_mask
        is_w = b["is_weights"] if spec.is_weights else None
        loss, m = POLICY_LOSSES.get(spec.loss)(
            logprobs,
            b["old_logprobs"],
            b["advantages"],
            mask,
            spec.loss_cfg,
            agg=agg,
            is_weights=is_w,
        )
        out: dict[str, float | torch.Tensor] = {f"train/{k}": v for k, v in m.items()}
        out["train/pg_loss"] = summed(loss.detach(), mb)
        if entropy is not None:
            out["train/entropy"] = masked_mean(entropy.detach(), mask)
            if spec.entropy_coef:
                e_loss, _ = entropy_loss(entropy, mask, coef=spec.entropy_coef, agg=agg)
                loss = loss + e_loss
        if spec.kl_coef:
            k_loss, _ = kl_loss(logprobs, b["ref_logprobs"], mask, spec.kl_type, agg=agg)
            out["train/kl_loss"] = summed(k_loss.detach(), mb)
            loss = loss + spec.kl_coef * k_loss
        return loss, out


@dataclass(frozen=True)
class CriticLoss:
    """The critic's clipped value loss; needs fields ``values`` (old) and ``returns``."""

    spec: CriticUpdate

    def __call__(
        self,
        logprobs: torch.Tensor | None,
        entropy: torch.Tensor | None,
        values: torch.Tensor | None,
        mb: MicroBatch,
        /,
    ) -> tuple[torch.Tensor, LossMetrics]:
        assert values is not None, "CriticLoss needs values (a critic engine)"
        b = mb.batch
        loss, m = value_loss(
            values,
            b["values"],
            b["returns"],
            b.loss_mask,
            clip=self.spec.value_clip,
            agg=aggregation(self.spec.agg, mb),
        )
        out: dict[str, float | torch.Tensor] = {f"critic/{k}": v for k, v in m.items()}
        out["critic/vf_loss"] = summed(loss.detach(), mb)
        return loss, out


@dataclass(frozen=True)
class NllLoss:
    """Token-mean cross-entropy on ``loss_mask`` tokens (SFT).

    ``prompt_weight`` > 0 adds the cross-entropy of every other real token (the prompt and
    the observations, each sequence's first token excepted), each weighing that much of a
    target token: language modelling on the pages and tool outputs a demonstration shows,
    which repeat content (an echoed value, the same tree a turn later) and so teach a model
    trained from scratch to copy. ``sft/loss`` stays the targets' loss; ``sft/prompt_loss``
    is the other tokens' mean."""

    prompt_weight: float = 0.0

    def __call__(
        self,
        logprobs: torch.Tensor | None,
        entropy: torch.Tensor | None,
        values: torch.Tensor | None,
        mb: MicroBatch,
        /,
    ) -> tuple[torch.Tensor, LossMetrics]:
        assert logprobs is not None, "NllLoss needs logprobs"
        mask = mb.batch.loss_mask
        n = max(float(mb.global_num_loss_tokens), 1.0)
        loss = -(logprobs * mask).sum() / n
        metrics: dict[str, float | torch.Tensor] = {"sft/loss": summed(loss.detach(), mb)}
        if self.prompt_weight > 0:
            other = mb.batch.attention_mask.to(logprobs.dtype) * (1 - mask.to(logprobs.dtype))
            other[:, 0] = 0  # a sequence's first token has nothing to be predicted from
            prompt_nll = -(logprobs * other).sum()
            metrics["sft/prompt_loss"] = float(prompt_nll.detach()) / max(float(other.sum()), 1.0)
            loss = loss + self.prompt_weight * prompt_nll / n
        return loss, metrics


def run_epochs(
    engine: Engine,
    batch: TrainBatch,
    loss: LossFn,
    *,
    epochs: int = 1,
    num_mini_batches: int = 1,
    temperature: float = 1.0,
    with_entropy: bool = False,
    prefix: str = "train",
) -> Metrics:
    """``epochs`` x ``num_mini_batches`` optimizer steps of ``loss`` on this rank's shard.

    The engine's own metrics (``train/grad_norm``, ``train/lr``, ``train/skipped_*``) are
    renamed to ``prefix`` (the critic reports under ``critic/``). Adds
    ``<prefix>/optimizer_steps`` and, when the loss reports ``<prefix>/ppo_kl``,
    ``<prefix>/ppo_kl_first``: the first mini-batch of the first epoch, which is exactly
    on-policy (0 unless the trainer and the sampler disagree).
    """
    minis = batch.split(min(num_mini_batches, len(batch)))
    steps: list[Metrics] = []
    for _ in range(epochs):
        for mini in minis:
            m = engine.forward_backward(
                mini, loss, temperature=temperature, with_entropy=with_entropy
            )
            m.update(engine.optimizer_step())
            steps.append({_renamed(k, prefix): v for k, v in m.items()})
    out = mean_metrics(steps)
    out[f"{prefix}/optimizer_steps"] = float(len(steps))
    if steps and f"{prefix}/ppo_kl" in steps[0]:
        out[f"{prefix}/ppo_kl_first"] = steps[0][f"{prefix}/ppo_kl"]
    return out


def _renamed(key: str, prefix: str) -> str:
    head, sep, rest = key.partition("/")
    return f"{prefix}/{rest}" if sep and head == "train" else key


def report_skipped_updates(metrics: Metrics, step: int) -> None:
    """A warning that names why optimizer steps of this RL step were skipped (weights kept)."""
    from trainers.engines.torch_native import SKIP_REASONS

    share = metrics.get("train/skipped_step", 0.0)
    if not share:
        return
    why = [text for r, text in SKIP_REASONS.items() if metrics.get(f"train/skipped_{r}", 0.0)]
    logger.warning(
        "step %d: %.0f%% of the policy's optimizer steps were skipped, weights unchanged for "
        "them: %s",
        step,
        100 * share,
        "; ".join(why) or "see train/skipped_* metrics",
    )
