"""Ray workers that hold one model role each: actor (policy), ref (frozen policy), critic.

    driver --DP_SPLIT TrainBatch--> RefWorker.compute_logprobs   -> batch + "logprobs" (+ "entropy")
           --DP_SPLIT TrainBatch--> ActorWorker.update_policy     -> per-rank metrics
           --RANK0--------------->  ActorWorker.named_weights     -> {HF name: tensor} for weight sync
           --ONE_TO_ALL---------->  save / load / export_hf       (every rank; the engine writes)

Each rank wraps one ``Engine`` (``trainers.engines``). Algorithms stay pure: the losses come
from ``agentrl.algos`` registries and are built inside the worker from a small picklable
spec (``PolicyUpdate`` / ``CriticUpdate``), so nothing but data crosses Ray.

PPO loop of one update (per rank, on its shard): ``epochs`` x ``num_mini_batches`` optimizer
steps; each mini-batch is one ``engine.forward_backward`` (the engine micro-batches it) with
the loss normalised by the global token/row count, then one ``engine.optimizer_step`` (which
skips the AdamW update when the gradient is exactly 0: no signal, no momentum step).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.algos import POLICY_LOSSES, Aggregation, PolicyLossConfig, entropy_loss, kl_loss
from agentrl.algos.aggregation import AggMode, masked_mean
from agentrl.algos.losses import value_loss
from agentrl.batch import TrainBatch
from agentrl.distributed import DataLayout, Dispatch, Worker, dispatch
from agentrl.engine import Engine, EngineConfig, LossFn, MicroBatch
from agentrl.logging import mean_metrics
from trainers.engines.megatron.config import MegatronConfig

logger = logging.getLogger(__name__)

Metrics = dict[str, float]


def build_engine(cfg: EngineConfig, megatron: MegatronConfig | None = None) -> Engine:
    """The engine ``cfg.backend`` names (``megatron`` also takes its parallel layout)."""
    from trainers.engines import ENGINES

    if cfg.backend == "megatron":
        return ENGINES.make("megatron", config=cfg, parallel=megatron or MegatronConfig())
    return ENGINES.make(cfg.backend, config=cfg)


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


def _aggregation(mode: str, mb: MicroBatch) -> Aggregation:
    """Normalise by the global count so summed micro-batch losses are the exact global mean."""
    n = mb.global_num_loss_tokens if mode == AggMode.TOKEN_MEAN else mb.global_num_rows
    return Aggregation(mode=mode, normaliser=max(float(n), 1.0))


def _summed(x: torch.Tensor, mb: MicroBatch) -> float:
    """A partial (globally normalised) loss, scaled so the engine's mean over pieces is its sum."""
    return float(x) * mb.count * mb.dp_size


def _undo_ray_niceness() -> None:
    """Ray starts workers at niceness 15; a trainer rank is the main job, not background work.

    On a busy machine a niced rank gets a small fraction of a core next to anything at
    niceness 0 (its own inference server included), so the update step crawls.
    """
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:  # lowering niceness needs CAP_SYS_NICE; keep Ray's then
        logger.debug("could not reset the worker's niceness", exc_info=True)


class EngineWorker(Worker):
    """One rank of a model role: builds and initialises its engine."""

    def __init__(
        self, cfg: EngineConfig, num_threads: int = 0, megatron: MegatronConfig | None = None
    ) -> None:
        _undo_ray_niceness()
        if num_threads > 0:  # Ray pins OMP threads to the bundle's CPUs; the driver knows better
            torch.set_num_threads(num_threads)
        if self.world_size > 1:
            self.init_process_group()
        torch.manual_seed(cfg.seed + self.rank)
        self.engine = build_engine(cfg, megatron)
        self.engine.initialize()

    def data_parallel_layout(self) -> DataLayout:
        """Model-parallel engines (megatron TP/PP) share a shard across their group's ranks."""
        dp_rank = getattr(self.engine, "data_parallel_rank", self.rank)
        dp_size = getattr(self.engine, "data_parallel_size", self.world_size)
        mp_rank = getattr(self.engine, "model_parallel_rank", 0)
        return DataLayout(dp_rank, dp_size, collect=mp_rank == 0)

    @dispatch(Dispatch.ONE_TO_ALL)
    def save(self, path: str) -> None:
        self.engine.save(Path(path))

    @dispatch(Dispatch.ONE_TO_ALL)
    def load(self, path: str) -> None:
        self.engine.load(Path(path))

    @dispatch(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self.engine.export_hf(Path(path))

    @dispatch(Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        self.engine.offload()

    @dispatch(Dispatch.ONE_TO_ALL)
    def onload(self) -> None:
        self.engine.onload()


class RefWorker(EngineWorker):
    """A policy that only scores tokens (the reference model, or the actor's old logprobs)."""

    @dispatch(Dispatch.DP_SPLIT)
    def compute_logprobs(
        self, batch: TrainBatch, temperature: float = 1.0, with_entropy: bool = False
    ) -> TrainBatch:
        """The shard with ``logprobs`` (B, T) (and ``entropy`` (B, T)) fields added."""
        logprobs, entropy = self.engine.compute_logprobs(
            batch, temperature, with_entropy=with_entropy
        )
        batch["logprobs"] = logprobs
        if entropy is not None:
            batch["entropy"] = entropy
        return batch


class ActorWorker(RefWorker):
    """The trained policy: PPO-style updates, SFT steps and weights for the inference servers."""

    @dispatch(Dispatch.DP_SPLIT)
    def update_policy(self, batch: TrainBatch, spec: PolicyUpdate) -> list[Metrics]:
        """Needs fields ``old_logprobs`` and ``advantages`` (and ``ref_logprobs`` for KL loss,
        ``is_weights`` (B, T) with ``spec.is_weights``).

        ``advantages`` is (B, T), or (B, 1) from a sequence-level estimator (grpo, rloo, ...):
        the losses broadcast it over ``loss_mask``. A mini-batch whose loss carries no gradient
        (all advantages 0, no entropy or KL term) makes the engine skip its optimizer step;
        ``train/skipped_step`` and ``train/skipped_<reason>`` report the fraction skipped.
        """
        loss_fn = POLICY_LOSSES.get(spec.loss)

        def policy_loss(
            logprobs: torch.Tensor | None,
            entropy: torch.Tensor | None,
            values: torch.Tensor | None,
            micro_batch: MicroBatch,
        ) -> tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]:
            mb = micro_batch
            assert logprobs is not None
            b, agg = mb.batch, _aggregation(spec.agg, mb)
            mask = b.loss_mask
            is_w = b["is_weights"] if spec.is_weights else None
            loss, m = loss_fn(
                logprobs, b["old_logprobs"], b["advantages"], mask, spec.loss_cfg, agg=agg,
                is_weights=is_w,
            )  # fmt: skip
            out: dict[str, float | torch.Tensor] = {f"train/{k}": v for k, v in m.items()}
            out["train/pg_loss"] = _summed(loss.detach(), mb)
            if entropy is not None:
                out["train/entropy"] = masked_mean(entropy.detach(), mask)
                if spec.entropy_coef:
                    e_loss, _ = entropy_loss(entropy, mask, coef=spec.entropy_coef, agg=agg)
                    loss = loss + e_loss
            if spec.kl_coef:
                k_loss, _ = kl_loss(logprobs, b["ref_logprobs"], mask, spec.kl_type, agg=agg)
                out["train/kl_loss"] = _summed(k_loss.detach(), mb)
                loss = loss + spec.kl_coef * k_loss
            return loss, out

        return [
            self._ppo_epochs(
                batch, policy_loss, spec.epochs, spec.num_mini_batches, spec.temperature
            )
        ]

    def _ppo_epochs(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        epochs: int,
        num_mini: int,
        temperature: float = 1.0,
    ) -> Metrics:
        minis = batch.split(min(num_mini, len(batch)))
        steps: list[Metrics] = []
        for _ in range(epochs):
            for mini in minis:
                m = self.engine.forward_backward(
                    mini,
                    loss_fn,
                    temperature=temperature,
                    with_entropy=True,
                )
                m.update(self.engine.optimizer_step())
                steps.append(m)
        out = mean_metrics(steps)
        out["train/optimizer_steps"] = float(len(steps))
        if steps:  # the first mini-batch of the first epoch: exactly on-policy
            first = steps[0]
            out["train/ppo_kl_first"] = first.get("train/ppo_kl", 0.0)
        return out

    @dispatch(Dispatch.DP_SPLIT)
    def sft_step(self, batch: TrainBatch) -> list[Metrics]:
        """One optimizer step of token-mean cross-entropy on ``loss_mask`` tokens."""

        def nll(
            logprobs: torch.Tensor | None,
            entropy: torch.Tensor | None,
            values: torch.Tensor | None,
            micro_batch: MicroBatch,
        ) -> tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]:
            mb = micro_batch
            assert logprobs is not None
            mask = mb.batch.loss_mask
            loss = -(logprobs * mask).sum() / max(float(mb.global_num_loss_tokens), 1.0)
            return loss, {"sft/loss": _summed(loss.detach(), mb)}

        m = self.engine.forward_backward(batch, nll)
        m.update(self.engine.optimizer_step())
        return [m]

    @dispatch(Dispatch.RANK0)
    def named_weights(self) -> dict[str, torch.Tensor]:
        """Full tensors by HF name (every rank iterates: sharded engines gather)."""
        return {name: t.detach().to("cpu").clone() for name, t in self.engine.named_weights()}


class CriticWorker(EngineWorker):
    """The value model of PPO (``adv_estimator=gae``)."""

    @dispatch(Dispatch.DP_SPLIT)
    def compute_values(self, batch: TrainBatch) -> TrainBatch:
        batch["values"] = self.engine.compute_values(batch)
        return batch

    @dispatch(Dispatch.DP_SPLIT)
    def update_critic(self, batch: TrainBatch, spec: CriticUpdate) -> list[Metrics]:
        """Needs fields ``values`` (old) and ``returns``."""

        def critic_loss(
            logprobs: torch.Tensor | None,
            entropy: torch.Tensor | None,
            values: torch.Tensor | None,
            micro_batch: MicroBatch,
        ) -> tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]:
            mb = micro_batch
            assert values is not None
            b = mb.batch
            loss, m = value_loss(
                values, b["values"], b["returns"], b.loss_mask, clip=spec.value_clip,
                agg=_aggregation(spec.agg, mb),
            )  # fmt: skip
            out: dict[str, float | torch.Tensor] = {f"critic/{k}": v for k, v in m.items()}
            out["critic/vf_loss"] = _summed(loss.detach(), mb)
            return loss, out

        minis = batch.split(min(spec.num_mini_batches, len(batch)))
        steps = []
        for _ in range(spec.epochs):
            for mini in minis:
                m = self.engine.forward_backward(mini, critic_loss)
                m.update(self.engine.optimizer_step())
                steps.append({f"critic/{k.partition('/')[2]}": v for k, v in m.items()})
        return [mean_metrics(steps)]
