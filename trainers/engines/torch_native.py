"""The torch-native Engine: a transformers model, FSDP2 across ranks, AdamW, on CPU or GPU.

    TrainBatch shard -> micro-batches (same count on every rank) -> Scorer forward
        -> loss_fn(logprobs, entropy, values, MicroBatch) -> backward (grads summed)
        -> optimizer_step: clip_grad_norm_ -> AdamW (skipped on a zero or non-finite norm)
           -> LR schedule

With ``torch.distributed`` initialised (gloo on CPU, nccl on GPU) the model is sharded with
FSDP2 ``fully_shard`` over all ranks; otherwise it is a plain module on one device. Each rank
passes its own shard of the batch. Collectives need every rank to run the same number of
forwards, so ranks agree on the micro-batch count first and a rank with too few rows runs a
throwaway micro-batch whose loss is ``0 * output`` (it contributes nothing).

State (save/load/export/weights/offload) lives in ``torch_state``; the model, the sharding and
the memory-aware logprob projection in ``torch_model``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from agentrl.batch import TrainBatch
from agentrl.engine import Engine, EngineConfig, LossFn, Metrics, MicroBatch
from agentrl.errors import ConfigError, TrainingError
from agentrl.vision import Vision
from trainers.engines import torch_state
from trainers.engines.torch_model import (
    DTYPES,
    Scorer,
    load_model,
    load_vision,
    plan_scoring,
    projection_chunk,
    shard,
)

logger = logging.getLogger(__name__)


def lr_factor(step: int, config: EngineConfig) -> float:
    """Multiplier of config.lr at optimizer step ``step`` (0-based): warmup, then the schedule."""
    warmup = config.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if config.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, config.total_steps - warmup))
    shape = (
        1.0 - progress
        if config.lr_schedule == "linear"
        else 0.5 * (1.0 + math.cos(math.pi * progress))
    )
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape


SKIP_REASONS = {
    "zero_grad": "every gradient is exactly 0 (e.g. all advantages are 0 and no KL/entropy term)",
    "nonfinite_grad": "the gradient norm is inf or NaN",
}
"""Why an optimizer step is skipped; each reason is reported as ``train/skipped_<reason>``."""


def skip_reason(grad_norm: float) -> str | None:
    """Why the update with this global gradient norm must not run, or None.

    A zero norm means the loss carried no gradient signal (every advantage 0 and no KL or
    entropy term): AdamW would still move the weights, by its momentum and weight decay, so the
    step is skipped. A non-finite norm would poison the weights.
    """
    if not math.isfinite(grad_norm):
        return "nonfinite_grad"
    if grad_norm == 0.0:
        return "zero_grad"
    return None


def skip_metrics(reason: str | None) -> Metrics:
    """``train/skipped_step`` (0/1) and one 0/1 ``train/skipped_<reason>`` per known reason."""
    out = {"train/skipped_step": float(reason is not None)}
    out |= {f"train/skipped_{r}": float(r == reason) for r in SKIP_REASONS}
    return out


class TorchEngine(Engine):
    """Engine on a transformers causal LM (or a token-classification critic); FSDP2 when distributed.

    engine = TorchEngine(EngineConfig(model_path=path, lr=1e-5))
    engine.initialize()
    metrics = engine.forward_backward(batch, loss_fn)
    metrics |= engine.optimizer_step()
    """

    Config = EngineConfig

    def __init__(self, config: EngineConfig, options: object = None) -> None:
        config.validate()
        if options is not None:
            raise ConfigError(f"the torch engine takes no options section, got {options!r}")
        self.config = config
        self.step = 0  # optimizer steps taken
        self._scorer: Scorer | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self._vision: Vision | None = None
        self.device = torch.device("cpu")
        self.world_size, self.rank = 1, 0

    # ---- setup ----------------------------------------------------------------------------

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def scorer(self) -> Scorer:
        if self._scorer is None:
            raise TrainingError(
                "TorchEngine used before initialize(); call engine.initialize() first"
            )
        return self._scorer

    def _pick_device(self) -> torch.device:
        want = self.config.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    "engine.device=cuda but no CUDA device is visible; use engine.device=cpu"
                )
            index = torch.cuda.current_device()
            if self.distributed:  # torchrun sets LOCAL_RANK; one process per GPU
                index = int(os.environ.get("LOCAL_RANK", self.rank)) % torch.cuda.device_count()
            torch.cuda.set_device(index)
            return torch.device("cuda", index)
        return torch.device(want)

    def initialize(self) -> None:
        if dist.is_available() and dist.is_initialized():
            self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.device = self._pick_device()
        torch.manual_seed(self.config.seed)
        model = load_model(self.config)
        self._vision = load_vision(self.config)
        head = model.get_output_embeddings()  # type: ignore[operator]  # None for a critic
        vocab = int(head.weight.shape[0]) if head is not None else 0
        self._scorer = Scorer(
            model,
            critic=self.config.role == "critic",
            chunk_tokens=projection_chunk(self.config.logprob_chunk_tokens, vocab, self.device),
            suppress=self._vision.special_ids if self._vision is not None else (),
        )
        if self.distributed:
            shard(self._scorer, self.config, self.device)
        self._scorer.to(self.device)
        if self.config.role != "ref":
            params = [p for p in self._scorer.parameters() if p.requires_grad]
            self._optimizer = torch.optim.AdamW(
                params,
                lr=self.config.lr,
                betas=(self.config.adam_beta1, self.config.adam_beta2),
                eps=self.config.adam_eps,
                weight_decay=self.config.weight_decay,
            )
            self._scheduler = torch.optim.lr_scheduler.LambdaLR(
                self._optimizer, lambda s: lr_factor(s, self.config)
            )
        logger.info(
            "torch engine ready: role=%s device=%s world_size=%d params=%d",
            self.config.role,
            self.device,
            self.world_size,
            sum(p.numel() for p in self._scorer.parameters()),
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            raise TrainingError(
                f"the {self.config.role!r} engine has no optimizer; only actor and "
                "critic engines train"
            )
        return self._optimizer

    # ---- collectives ----------------------------------------------------------------------

    def _all_reduce(self, value: float, op: str = "sum") -> float:
        if not self.distributed:
            return value
        comm_device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.float64, device=comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return float(t.item())

    def _micro_batches(
        self, batch: TrainBatch, num: int | None, max_tokens: int | None
    ) -> list[tuple[TrainBatch, bool]]:
        """This rank's micro-batches, as many as on the rank that needs most; (mb, real)."""
        if num is None and max_tokens is None:
            max_tokens = self.config.max_tokens_per_micro_batch or None
        if num is not None:
            parts = batch.split(min(num, len(batch)))
        elif max_tokens is not None:
            parts = batch.micro_batches(max_tokens=max_tokens)
        else:
            parts = batch.micro_batches(size=self.config.micro_batch_size)
        count = max(int(self._all_reduce(len(parts), "max")), num or 0)
        if count == len(parts):
            return [(p, True) for p in parts]
        parts = batch.split(min(count, len(batch)))
        filler = batch.select([0])
        return [(p, True) for p in parts] + [(filler, False)] * (count - len(parts))

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.distributed or self.config.dtype == "float32":
            return contextlib.nullcontext()  # FSDP2's MixedPrecisionPolicy casts when sharded
        return torch.autocast(self.device.type, dtype=DTYPES[self.config.dtype])

    def _forward(
        self, mb: TrainBatch, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        plan = plan_scoring(mb, self.config.packed, self._vision)
        with self._autocast():
            return self.scorer(plan, temperature, with_entropy)  # type: ignore[no-any-return]

    # ---- forward-only ---------------------------------------------------------------------

    @torch.no_grad()
    def _score(
        self, batch: TrainBatch, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.zeros(len(batch), batch.seq_len)
        ent = torch.zeros(len(batch), batch.seq_len) if with_entropy else None
        row = 0
        for mb, real in self._micro_batches(batch, None, None):
            a, e = self._forward(mb.to(self.device), temperature, with_entropy)
            if not real:
                continue
            b, t = a.shape
            out[row : row + b, :t] = a.float().cpu()
            if ent is not None and e is not None:
                ent[row : row + b, :t] = e.float().cpu()
            row += b
        torch_state.reshard(self.scorer)  # a forward without backward leaves the root gathered
        return out, ent

    def compute_logprobs(
        self, batch: TrainBatch, temperature: float = 1.0, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.config.role == "critic":
            raise TrainingError("compute_logprobs on a critic engine; use compute_values")
        return self._score(batch, temperature, with_entropy)

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        if self.config.role != "critic":
            raise TrainingError(
                f"compute_values on a {self.config.role!r} engine; set engine.role=critic"
            )
        return self._score(batch, 1.0, False)[0]

    # ---- training -------------------------------------------------------------------------

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
        _ = self.optimizer  # raises for a ref engine, before any forward
        mbs = self._micro_batches(batch, num_micro_batches, max_tokens)
        global_tokens = self._all_reduce(float(batch.loss_mask.sum()))
        global_rows = self._all_reduce(float(batch.sample_mask.sum()))
        critic = self.config.role == "critic"
        total_loss = 0.0
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for i, (mb, real) in enumerate(mbs):
            mb = mb.to(self.device)
            out, ent = self._forward(mb, temperature, with_entropy)
            if not real:
                (out.sum() * 0.0).backward()  # keeps the ranks' collectives in step
                continue
            context = MicroBatch(
                batch=mb,
                index=i,
                count=len(mbs),
                global_num_loss_tokens=global_tokens,
                global_num_rows=global_rows,
                dp_size=self.world_size,
            )
            loss, metrics = loss_fn(None if critic else out, ent, out if critic else None, context)
            if loss.dim() != 0:
                raise TrainingError(
                    f"loss_fn must return a scalar loss; got shape {tuple(loss.shape)}"
                )
            if not loss.requires_grad:
                loss = loss + out.sum() * 0.0  # a constant loss still runs backward's collectives
            loss.backward()
            total_loss += float(loss.detach())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach() if isinstance(v, torch.Tensor) else v)
                counts[k] = counts.get(k, 0) + 1
        return self._reduce_metrics(total_loss, sums, counts)

    def _reduce_metrics(
        self, total_loss: float, sums: Mapping[str, float], counts: Mapping[str, int]
    ) -> Metrics:
        local = {k: sums[k] / counts[k] for k in sums}
        if not self.distributed:
            return {"train/loss": total_loss, **local}
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, local)
        keys = sorted({k for g in gathered for k in g})
        merged = {
            k: sum(g[k] for g in gathered if k in g) / sum(k in g for g in gathered) for k in keys
        }
        return {"train/loss": self._all_reduce(total_loss), **merged}

    def optimizer_step(self) -> Metrics:
        """Clip, then AdamW, unless the update carries nothing: see :func:`skip_reason`.

        A skipped step leaves weights and Adam's moments and step count untouched, but the LR
        schedule and ``self.step`` still advance: they count update opportunities, so the
        schedule stays a function of the training step (it reaches ``total_steps`` when the run
        does) and a resumed run replays the same LRs, skipped steps included.
        """
        optimizer = self.optimizer
        params = [p for group in optimizer.param_groups for p in group["params"]]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        lr = float(optimizer.param_groups[0]["lr"])
        reason = skip_reason(norm_value)
        if reason is not None:
            log = logger.info if reason == "zero_grad" else logger.warning
            log(
                "skipping the optimizer update at step %d: %s (grad norm %s)",
                self.step,
                SKIP_REASONS[reason],
                norm_value,
            )
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert self._scheduler is not None
        with warnings.catch_warnings():
            # A skipped first update advances the schedule before any optimizer.step(), on
            # purpose (see above); PyTorch would warn about that order on every such run.
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            self._scheduler.step()
        self.step += 1
        return {"train/grad_norm": norm_value, "train/lr": lr, **skip_metrics(reason)}

    # ---- state ----------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return torch_state.named_weights(self.scorer)

    def save(self, path: str | Path) -> None:
        torch_state.save(self, Path(path))

    def load(self, path: str | Path) -> None:
        torch_state.load(self, Path(path))

    def export_hf(self, path: str | Path) -> None:
        torch_state.export_hf(self, Path(path))

    def offload(self) -> None:
        torch_state.move(self, torch.device("cpu"))

    def onload(self) -> None:
        torch_state.move(self, self.device)
