"""The Engine interface: what a trainer worker calls to run a model on TrainBatches.

    worker -> engine.compute_logprobs(batch)                       old / ref logprobs
           -> engine.forward_backward(batch, loss_fn) (x k)        gradients accumulate
           -> engine.optimizer_step()                              clip, step, LR schedule
           -> engine.named_weights()                               weight sync to inference
           -> engine.save(dir) / load(dir) / export_hf(dir)

Every rank of a data-parallel group calls every method with its own shard of the batch (the
ranks' shards may differ in size). Engines implement the mechanics (sharding, micro-batching,
mixed precision, offload); algorithms stay in the ``loss_fn`` they are handed.

Gradient contract: ``forward_backward`` applies the gradient of the SUM of the losses that
``loss_fn`` returns, over its micro-batches and over all data-parallel ranks (no averaging).
A loss normalised by ``MicroBatch.global_num_loss_tokens`` therefore gives an exact global token
mean however the batch was split; one normalised by ``global_num_rows`` a global sequence mean.

Tensors are token-aligned as ``agentrl.batch`` documents: ``logprobs[:, t]`` is the logprob of
token t (position 0 is undefined and 0.0), ``values[:, t]`` the critic's value of the state
before token t. Results come back as float32 on the CPU, one row per batch row.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentrl.errors import ConfigError

if TYPE_CHECKING:  # keeps `import agentrl.engine` free of torch
    import torch

    from agentrl.batch import TrainBatch

ROLES = ("actor", "ref", "critic")
LR_SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(kw_only=True)
class EngineConfig:
    """How to build and train one model. Shared by every engine backend."""

    model_path: str = ""
    """Local Hugging Face directory to load."""
    backend: str = "torch"
    """Which engine trains it: torch (transformers, FSDP2) or megatron (Megatron-core, CUDA)."""
    role: str = "actor"
    """actor (policy, trained), ref (frozen, logprobs only) or critic (value head, trained)."""
    dtype: str = "float32"
    """Compute dtype: float32, bfloat16 or float16. Master weights and optimizer state stay fp32."""
    lr: float = 1e-6
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    warmup_steps: int = 0
    """Linear warmup over this many optimizer steps (the first step uses lr / warmup_steps)."""
    lr_schedule: str = "constant"
    """constant, linear or cosine (linear and cosine decay to min_lr_ratio * lr at total_steps)."""
    total_steps: int = 0
    """Optimizer steps in the run; needed by the linear and cosine schedules."""
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still reported)."""
    micro_batch_size: int = 8
    """Rows per micro-batch, used when max_tokens_per_micro_batch is 0."""
    max_tokens_per_micro_batch: int = 0
    """Real-token budget per micro-batch (dynamic batch size); 0 uses micro_batch_size."""
    packed: bool = False
    """Padding-free forward: concatenate the rows of a micro-batch into one sequence."""
    logprob_chunk_tokens: int = 0
    """Tokens per chunk when projecting hidden states to vocabulary logprobs (bounds memory).
    0: by device (``trainers.engines.torch_model.projection_chunk``): 1,024 on CPU; on a GPU,
    as many as keep one chunk's fp32 logits within 256 MiB, from 1,024 to 65,536."""
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    seed: int = 0
    device: str = "auto"
    """auto (cuda when available, else cpu), cpu or cuda."""

    def validate(self) -> None:
        checks = [
            ("role", self.role, ROLES),
            ("lr_schedule", self.lr_schedule, LR_SCHEDULES),
            ("dtype", self.dtype, DTYPES),
        ]
        for key, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(
                    f"engine.{key} must be one of {', '.join(allowed)}; got {value!r}"
                )
        if self.lr_schedule != "constant" and self.total_steps <= 0:
            raise ConfigError(
                f"engine.lr_schedule={self.lr_schedule} needs engine.total_steps > 0 "
                f"(got {self.total_steps}); set it to the run's optimizer steps"
            )
        if self.logprob_chunk_tokens < 0:
            raise ConfigError(
                f"engine.logprob_chunk_tokens must be >= 0 (0: chosen by device), got "
                f"{self.logprob_chunk_tokens}"
            )
        if self.micro_batch_size < 1 and self.max_tokens_per_micro_batch < 1:
            raise ConfigError(
                "set engine.micro_batch_size >= 1 or engine.max_tokens_per_micro_batch >= 1"
            )


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """What a loss function sees besides the model outputs: the rows and the global counts."""

    batch: TrainBatch  # this micro-batch's rows, on the engine's device
    index: int  # which micro-batch of this rank's forward_backward call
    count: int  # micro-batches per rank in this call (the same on every rank)
    global_num_loss_tokens: float  # sum of loss_mask over all micro-batches and all ranks
    global_num_rows: float  # sum of sample_mask over all micro-batches and all ranks
    dp_size: int  # data-parallel ranks


Metrics = dict[str, float]


class LossFn(Protocol):
    """``loss_fn(logprobs, entropy, values, micro_batch) -> (loss, metrics)``.

    logprobs/entropy (B, T) for an actor, values (B, T) for a critic (the other is None);
    ``loss`` is a scalar whose gradient is summed over micro-batches and ranks.
    """

    def __call__(
        self,
        logprobs: torch.Tensor | None,
        entropy: torch.Tensor | None,
        values: torch.Tensor | None,
        micro_batch: MicroBatch,
        /,
    ) -> tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]: ...


class Engine(abc.ABC):
    """A model, its optimizer and its sharding, driven by TrainBatches.

    Subclasses implement every method; all ranks of the group call them in the same order.
    """

    config: EngineConfig
    step: int
    """Optimizer steps taken (restored by ``load``)."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Load the model, shard it, build the optimizer and LR schedule. Call once."""

    @abc.abstractmethod
    def compute_logprobs(
        self, batch: TrainBatch, temperature: float = 1.0, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logprobs (B, T) of the batch's tokens at ``temperature``, and entropy (B, T) if asked."""

    @abc.abstractmethod
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values (B, T); only for role=critic."""

    @abc.abstractmethod
    def forward_backward(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        num_micro_batches: int | None = None,
        max_tokens: int | None = None,
    ) -> Metrics:
        """Accumulate the gradient of ``sum(loss_fn(...))`` over micro-batches (and ranks).

        Gradients keep accumulating across calls until ``optimizer_step`` zeroes them, so a
        mini-batch may be fed in several calls.

        Micro-batching follows the config unless ``num_micro_batches`` or ``max_tokens`` is
        given. Returns ``train/loss`` (the summed loss over micro-batches and ranks) and each
        ``loss_fn`` metric averaged over micro-batches and ranks.
        """

    @abc.abstractmethod
    def optimizer_step(self) -> Metrics:
        """Clip, step the optimizer and the LR schedule, zero grads: ``train/grad_norm``, ``train/lr``."""

    @abc.abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) tensors with Hugging Face names, one at a time; every rank iterates."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None:
        """Everything needed to resume exactly: weights, optimizer, LR schedule, step, RNG."""

    @abc.abstractmethod
    def load(self, path: str | Path) -> None:
        """Restore what ``save`` wrote; the next step equals the uninterrupted one."""

    @abc.abstractmethod
    def export_hf(self, path: str | Path) -> None:
        """Write a Hugging Face directory (weights + config + tokenizer) that from_pretrained loads."""

    @abc.abstractmethod
    def offload(self) -> None:
        """Move weights, gradients and optimizer state to CPU memory (frees the accelerator)."""

    @abc.abstractmethod
    def onload(self) -> None:
        """Move what ``offload`` moved back to the accelerator."""
