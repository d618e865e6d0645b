"""Ray workers that hold one model role each: actor (policy), ref (frozen policy), critic.

    driver --DP_SPLIT TrainBatch--> RefWorker.compute_logprobs   -> BatchFields "logprobs" (+ "entropy")
           --DP_SPLIT TrainBatch--> CriticWorker.compute_values  -> BatchFields "values"
           --DP_SPLIT TrainBatch--> ActorWorker.update_policy     -> per-rank metrics
           --RANK0--------------->  ActorWorker.named_weights     -> {HF name: tensor} for weight sync
           --ONE_TO_ALL---------->  save / load / export_hf       (every rank; the engine writes)

Scoring calls return only the fields they compute (``BatchFields``), never the batch: the
driver puts a step's batch in the object store once (``WorkerGroup.shard``), every scoring
call reads those shards (``call_sharded``), and only the new (B, T) tensors come back.

Each rank wraps one ``Engine`` (``trainers.engines``). Algorithms stay pure: the losses come
from ``agentrl.algos`` registries and are built inside the worker from a small picklable
spec (``PolicyUpdate`` / ``CriticUpdate``), so nothing but data crosses Ray.

Every update (actor, critic, SFT) is ``trainers.updates.run_epochs``: ``epochs`` x
``num_mini_batches`` optimizer steps; each mini-batch is one ``engine.forward_backward`` (the
engine micro-batches it) with the loss normalised by the global token/row count, then one
``engine.optimizer_step`` (which skips the AdamW update when the gradient is exactly 0: no
signal, no momentum step). The losses are the objects in ``trainers.updates``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from agentrl import heap
from agentrl.batch import BatchFields, TrainBatch
from agentrl.distributed import DataLayout, Dispatch, ResourcePool, Worker, WorkerGroup, dispatch
from agentrl.engine import Engine, EngineConfig
from trainers.updates import (
    CriticLoss,
    CriticUpdate,
    NllLoss,
    PolicyLoss,
    PolicyUpdate,
    run_epochs,
)

if TYPE_CHECKING:  # not at run time: Ray workers import this module and need no run config
    from trainers.config import RunConfig

logger = logging.getLogger(__name__)

Metrics = dict[str, float]
W = TypeVar("W", bound=Worker)
__all__ = [
    "ActorWorker",
    "CriticUpdate",
    "CriticWorker",
    "PolicyUpdate",
    "RefWorker",
    "Roles",
    "build_roles",
]


def build_engine(cfg: EngineConfig, options: object = None) -> Engine:
    """The engine ``cfg.backend`` names, with its own options section (``RunConfig.engine_options``)."""
    from trainers.engines import ENGINES

    return ENGINES.make(cfg.backend, config=cfg, options=options)


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

    def __init__(self, cfg: EngineConfig, num_threads: int = 0, options: object = None) -> None:
        _undo_ray_niceness()
        if num_threads > 0:  # Ray pins OMP threads to the bundle's CPUs; the driver knows better
            torch.set_num_threads(num_threads)
        if self.world_size > 1:
            self.init_process_group()
        torch.manual_seed(cfg.seed + self.rank)
        self.engine = build_engine(cfg, options)
        self.engine.initialize()
        heap.freeze()  # torch, the model, the optimizer: out of the collector's full passes

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
    ) -> BatchFields:
        """``logprobs`` (B, T) (and ``entropy`` (B, T)) of the shard's rows, nothing else."""
        logprobs, entropy = self.engine.compute_logprobs(
            batch, temperature, with_entropy=with_entropy
        )
        fields = {"logprobs": logprobs.detach().cpu()}
        if entropy is not None:
            fields["entropy"] = entropy.detach().cpu()
        return BatchFields(fields)


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
        return [
            run_epochs(
                self.engine,
                batch,
                PolicyLoss(spec),
                epochs=spec.epochs,
                num_mini_batches=spec.num_mini_batches,
                temperature=spec.temperature,
                with_entropy=True,
            )
        ]

    @dispatch(Dispatch.DP_SPLIT)
    def sft_step(self, batch: TrainBatch, prompt_weight: float = 0.0) -> list[Metrics]:
        """One optimizer step of token-mean cross-entropy on ``loss_mask`` tokens (plus
        ``prompt_weight`` x that of the other tokens: ``NllLoss``)."""
        return [run_epochs(self.engine, batch, NllLoss(prompt_weight))]

    @dispatch(Dispatch.RANK0)
    def named_weights(self) -> dict[str, torch.Tensor]:
        """Full tensors by HF name (every rank iterates: sharded engines gather)."""
        return {name: t.detach().to("cpu").clone() for name, t in self.engine.named_weights()}


class CriticWorker(EngineWorker):
    """The value model of PPO (``adv_estimator=gae``)."""

    @dispatch(Dispatch.DP_SPLIT)
    def compute_values(self, batch: TrainBatch) -> BatchFields:
        """``values`` (B, T) of the shard's rows, nothing else."""
        return BatchFields({"values": self.engine.compute_values(batch).detach().cpu()})

    @dispatch(Dispatch.DP_SPLIT)
    def update_critic(self, batch: TrainBatch, spec: CriticUpdate) -> list[Metrics]:
        """Needs fields ``values`` (old) and ``returns``."""
        return [
            run_epochs(
                self.engine,
                batch,
                CriticLoss(spec),
                epochs=spec.epochs,
                num_mini_batches=spec.num_mini_batches,
                prefix="critic",
            )
        ]


@dataclass
class Roles:
    """A run's worker groups: the actor always, ref with a KL term, critic with GAE."""

    actor: WorkerGroup[ActorWorker]
    ref: WorkerGroup[RefWorker] | None
    critic: WorkerGroup[CriticWorker] | None

    @property
    def groups(self) -> list[WorkerGroup[Any]]:
        """In the order they were started (shut them down in reverse)."""
        return [g for g in (self.actor, self.ref, self.critic) if g is not None]


def build_roles(cfg: RunConfig, pool: ResourcePool, policy_path: Path, num_threads: int) -> Roles:
    """Start the worker groups ``cfg`` needs on ``pool``, each with an equal share of it; if one
    fails to start, the ones already started are shut down before the error propagates."""
    opt_steps = (
        cfg.train.steps
        * cfg.train.ppo_epochs
        * (cfg.train.batch_size // (cfg.train.mini_batch_size or cfg.train.batch_size))
    )
    actor_cfg = replace(
        cfg.engine,
        model_path=str(policy_path),
        role="actor",
        total_steps=cfg.engine.total_steps or opt_steps,
        seed=cfg.seed,
    )
    with_ref, with_critic = cfg.algo.kl.coef != 0, cfg.algo.adv_estimator == "gae"
    share = 1.0 / (1 + int(with_ref) + int(with_critic))
    started: list[WorkerGroup[Any]] = []

    def group(cls: type[W], engine_cfg: EngineConfig) -> WorkerGroup[W]:
        kwargs = {
            "cfg": engine_cfg,
            "num_threads": num_threads,
            "options": cfg.engine_options(engine_cfg.backend),
        }
        g = WorkerGroup(pool, cls, kwargs=kwargs, share=share, name=engine_cfg.role)
        started.append(g)
        return g

    try:
        actor = group(ActorWorker, actor_cfg)
        ref = group(RefWorker, replace(actor_cfg, role="ref")) if with_ref else None
        critic = None
        if with_critic:
            critic_cfg = replace(
                cfg.critic,
                model_path=cfg.critic.model_path or str(policy_path),
                role="critic",
                total_steps=cfg.critic.total_steps or opt_steps,
                seed=cfg.seed,
            )
            critic = group(CriticWorker, critic_cfg)
    except BaseException:
        for g in reversed(started):
            g.shutdown()
        raise
    return Roles(actor=actor, ref=ref, critic=critic)
