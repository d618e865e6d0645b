"""The Megatron-core Engine: GPTModel (local spec, SDPA attention), TP / PP / DP, distributed Adam.

    HF dir -> convert.hf_to_megatron -> this rank's (tp, pp) slice -> GPTModel -> Float16Module
        -> megatron DistributedDataParallel (fp32 grad buffers, summed over DP)
    TrainBatch shard -> micro-batches -> get_forward_backward_func() schedule
        -> output processor: hidden states -> vocab-parallel logprobs (B, T) on the last stage
        -> loss_fn(logprobs, entropy, None, MicroBatch) -> backward (grads accumulate)
    optimizer_step: finalize grads (DP reduce-scatter) -> clip -> Adam on fp32 shards -> LR

Every rank of a model-parallel group (the TP and PP ranks that share a data-parallel index)
must be handed the same batch shard; ``data_parallel_rank`` / ``data_parallel_size`` say which
shard a rank owns. Results (logprobs, metrics) come back on every rank; with PP > 1 the last
stage broadcasts them.

Departures from the torch-native engine: with ``dtype=bfloat16`` the model parameters are bf16
(Megatron's mixed precision) and the fp32 master weights start from them, so an fp32 checkpoint
is rounded to bf16 once at load; ``named_weights`` yields the bf16 parameters; Megatron's
optimizer does not decay biases and norm weights. Critics are not supported.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.batch import TrainBatch
from agentrl.engine import Engine, EngineConfig, LossFn, Metrics, MicroBatch
from agentrl.errors import ConfigError, TrainingError
from trainers.engines.megatron import state
from trainers.engines.megatron.config import MegatronConfig
from trainers.engines.megatron.forward import Scoring, forward_step
from trainers.engines.megatron.model import (
    COMPILE_SCOPES,
    ModelShape,
    Parallelism,
    build_model,
    compile_layers,
    model_shape,
    transformer_config,
)
from trainers.engines.megatron.optim import LeanStep, unsupported
from trainers.engines.readback import HostCopy
from trainers.engines.torch_model import DTYPES, projection_chunk
from trainers.engines.torch_native import lr_factor, skip_metrics

logger = logging.getLogger(__name__)


def _use_fused_torch_adam(optimizer: Any) -> None:
    """Switch the torch AdamW inside Megatron's optimizer wrappers to the fused kernel.

    A no-op when Megatron found Apex / Transformer Engine (their FusedAdam is already fused).
    """
    inners = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [])]
    for inner in inners or [getattr(optimizer, "optimizer", None)]:
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            for group in inner.param_groups:
                group["foreach"], group["fused"] = False, True


def _init_process_group() -> None:
    """Join torch.distributed from the launcher's env (rank 0's store on MASTER_ADDR only)."""
    from agentrl.distributed.rendezvous import init_process_group_bound, init_process_group_from_env

    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" not in os.environ:  # one process, no launcher: any free port on loopback
        init_process_group_bound(
            backend=backend, master_addr="127.0.0.1", master_port=0, rank=0, world_size=1
        )
    else:
        init_process_group_from_env(backend)


class MegatronEngine(Engine):
    """Engine on Megatron-core (tensor, pipeline and data parallel; CUDA for training).

    engine = MegatronEngine(EngineConfig(model_path=path, dtype="bfloat16"),
                            MegatronEngine.Config(tensor_parallel_size=2))
    engine.initialize()
    metrics = engine.forward_backward(batch, loss_fn) | engine.optimizer_step()
    """

    Config = MegatronConfig

    def __init__(
        self,
        config: EngineConfig,
        options: MegatronConfig | None = None,
        *,
        parallel: MegatronConfig | None = None,
    ) -> None:
        """``options``: the run's ``megatron:`` section (``parallel=`` is its deprecated name)."""
        config.validate()
        if config.role == "critic":
            raise ConfigError("the megatron engine has no critic (value head); use engine=torch")
        if parallel is not None:
            import warnings

            warnings.warn(
                "MegatronEngine(parallel=...) is now options=...", DeprecationWarning, stacklevel=2
            )
        self.config = config
        self.parallel = options or parallel or MegatronConfig()
        self.step = 0
        self.shape: ModelShape | None = None
        self._ddp: Any = None
        self._optimizer: Any = None
        self._lean_step: LeanStep | None = None
        self.device = torch.device("cpu")

    # ---- setup ----------------------------------------------------------------------------

    def initialize(self) -> None:
        from megatron.core import parallel_state, tensor_parallel
        from transformers import AutoConfig

        p = self.parallel
        if p.compile_scope not in COMPILE_SCOPES:
            raise ConfigError(
                f"megatron.compile_scope must be one of {COMPILE_SCOPES}, got {p.compile_scope!r}"
            )
        if self.config.role != "ref" and (
            self.config.device == "cpu" or not torch.cuda.is_available()
        ):
            raise ConfigError(
                "the megatron engine trains on CUDA only (its optimizer and schedules allocate "
                "on the GPU); use engine=torch on CPU, or role=ref for CPU scoring"
            )
        _init_process_group()
        if torch.cuda.is_available() and self.config.device != "cpu":
            local = int(os.environ.get("LOCAL_RANK", dist.get_rank())) % torch.cuda.device_count()
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=p.tensor_parallel_size,
                pipeline_model_parallel_size=p.pipeline_parallel_size,
                context_parallel_size=p.context_parallel_size,
            )
        torch.manual_seed(self.config.seed)
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(self.config.seed)
        self.shape = model_shape(AutoConfig.from_pretrained(self.config.model_path))
        self._tconfig = transformer_config(
            self.shape,
            dtype=DTYPES[self.config.dtype],
            parallel=Parallelism(
                tensor=p.tensor_parallel_size,
                pipeline=p.pipeline_parallel_size,
                context=p.context_parallel_size,
            ),
            recompute=self.config.gradient_checkpointing and self.config.role != "ref",
            cpu_init=self.device.type == "cpu",
            fused=self.device.type == "cuda",
        )
        self._tconfig.variable_seq_lengths = p.pipeline_parallel_size > 1
        self._build()
        logger.info(
            "megatron engine ready: role=%s tp=%d pp=%d dp=%d dtype=%s",
            self.config.role,
            p.tensor_parallel_size,
            p.pipeline_parallel_size,
            self.data_parallel_size,
            self.config.dtype,
        )

    def _build(self) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.transformer.module import Float16Module

        assert self.shape is not None
        model = build_model(
            self.shape,
            self._tconfig,
            vocab_multiple=self.parallel.vocab_multiple,
            pre_process=ps.is_pipeline_first_stage(),
            post_process=ps.is_pipeline_last_stage(),
            sdpa=self.parallel.sdpa_attention,
        )
        state.load_hf_weights(model, self.config.model_path, self.shape, self.parallel)
        model.to(self.device)
        if self.parallel.compile_layers:
            # Megatron's full recompute wraps layers in a checkpoint dynamo does not trace
            scope = "layer" if self._tconfig.recompute_granularity else self.parallel.compile_scope
            compile_layers(model, self.parallel.compile_mode, scope=scope)
        if self.config.dtype != "float32":
            model = Float16Module(self._tconfig, model)
        if self.config.role == "ref":
            model.requires_grad_(False)
            self._ddp = model.eval()
            return
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.parallel.use_distributed_optimizer,
        )
        self._ddp = DistributedDataParallel(self._tconfig, ddp_config, model)
        self._optimizer = self._make_optimizer()
        why = unsupported(self._optimizer) if self.parallel.lean_optimizer_step else "turned off"
        if why is None:
            self._lean_step = LeanStep(self._optimizer, self._optimizer.config.clip_grad)
        else:
            logger.info("megatron engine: Megatron's own optimizer step (%s)", why)

    def _make_optimizer(self) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        c = self.config
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=c.lr,
            min_lr=c.lr * c.min_lr_ratio,
            weight_decay=c.weight_decay,
            adam_beta1=c.adam_beta1,
            adam_beta2=c.adam_beta2,
            adam_eps=c.adam_eps,
            clip_grad=c.max_grad_norm if c.max_grad_norm > 0 else 1e12,
            bf16=c.dtype == "bfloat16",
            fp16=c.dtype == "float16",
            params_dtype=DTYPES[c.dtype],
            use_distributed_optimizer=self.parallel.use_distributed_optimizer,
        )
        optimizer = get_megatron_optimizer(opt_config, [self._ddp])
        if self.parallel.fused_adam and self.device.type == "cuda":
            _use_fused_torch_adam(optimizer)
        self._set_lr(c.lr * lr_factor(0, c), optimizer)
        return optimizer

    @staticmethod
    def _set_lr(lr: float, optimizer: Any) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    @property
    def data_parallel_rank(self) -> int:
        from megatron.core import parallel_state

        return int(parallel_state.get_data_parallel_rank())

    @property
    def data_parallel_size(self) -> int:
        from megatron.core import parallel_state

        return int(parallel_state.get_data_parallel_world_size())

    @property
    def model_parallel_rank(self) -> int:
        """0 on the first rank of this rank's model-parallel group (TP x CP x PP), else > 0."""
        from megatron.core import parallel_state as ps

        p = self.parallel
        tp, cp = ps.get_tensor_model_parallel_rank(), ps.get_context_parallel_rank()
        pp = ps.get_pipeline_model_parallel_rank()
        return int(tp + p.tensor_parallel_size * (cp + p.context_parallel_size * pp))

    @property
    def model(self) -> Any:
        """The GPTModel of this rank (unwrapped from DDP and Float16Module)."""
        if self._ddp is None:
            raise TrainingError("MegatronEngine used before initialize(); call initialize() first")
        m = self._ddp
        while hasattr(m, "module"):
            m = m.module
        return m

    # ---- forward --------------------------------------------------------------------------

    def _run(
        self,
        handle: Any,
        *,
        temperature: float,
        with_entropy: bool,
        forward_only: bool,
        mbs: list[TrainBatch],
    ) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        assert self.shape is not None
        scoring = Scoring(
            packed=self.config.packed,
            temperature=temperature,
            with_entropy=with_entropy,
            true_vocab=self.shape.vocab_size,
            chunk_tokens=projection_chunk(
                self.config.logprob_chunk_tokens,
                self.shape.vocab_size // self.parallel.tensor_parallel_size,  # this rank's slice
                self.device,
            ),
            device=self.device,
            compile_backend=(
                "inductor"
                if self.parallel.compile_layers and self.parallel.tensor_parallel_size == 1
                else None
            ),
        )
        data = iter([(mb.to(self.device), i) for i, mb in enumerate(mbs)])
        step = partial(forward_step, scoring, handle)
        if forward_only and self.parallel.pipeline_parallel_size == 1:
            for _ in mbs:  # no schedule needed (and this path runs on CPU too)
                output, finish = step(data, self._ddp)
                finish(output)
            return
        get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=data,
            model=[self._ddp],
            num_microbatches=len(mbs),
            seq_length=max(mb.seq_len for mb in mbs),
            micro_batch_size=max(len(mb) for mb in mbs),
            forward_only=forward_only,
        )

    def _micro_batches(
        self, batch: TrainBatch, num: int | None, max_tokens: int | None
    ) -> list[TrainBatch]:
        if num is not None:
            return batch.split(min(num, len(batch)))
        max_tokens = max_tokens or self.config.max_tokens_per_micro_batch or None
        if max_tokens is not None:
            return batch.micro_batches(max_tokens=max_tokens)
        return batch.micro_batches(size=self.config.micro_batch_size)

    @torch.no_grad()
    def compute_logprobs(
        self, batch: TrainBatch, temperature: float = 1.0, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.zeros(len(batch), batch.seq_len, device=self.device)
        ent = torch.zeros(len(batch), batch.seq_len, device=self.device)
        rows = [0]

        def collect(mb: TrainBatch, index: int, output: Any) -> Any:
            logp, e = output
            b, t = logp.shape
            out[rows[0] : rows[0] + b, :t] = logp.float()
            ent[rows[0] : rows[0] + b, :t] = e.float()
            rows[0] += b
            return logp.new_zeros(()), torch.tensor(1, dtype=torch.int, device=self.device), {}

        self._ddp.eval()
        mbs = self._micro_batches(batch, None, None)
        self._run(
            collect, temperature=temperature, with_entropy=with_entropy, forward_only=True, mbs=mbs
        )
        self._ddp.train(self.config.role != "ref")
        state.broadcast_from_last_stage(out)
        if with_entropy:
            state.broadcast_from_last_stage(ent)
        return out.cpu(), (ent.cpu() if with_entropy else None)

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        raise TrainingError("the megatron engine has no critic; use engine=torch for role=critic")

    # ---- training -------------------------------------------------------------------------

    def _all_reduce_dp(self, value: float) -> float:
        from megatron.core import parallel_state

        if self.data_parallel_size == 1:  # no collective, no device sync
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=parallel_state.get_data_parallel_group())
        return float(t.item())

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
        if self._optimizer is None:
            raise TrainingError("the 'ref' engine has no optimizer; only actor engines train")
        global_tokens = self._all_reduce_dp(float(batch.loss_mask.sum()))
        global_rows = self._all_reduce_dp(float(batch.sample_mask.sum()))
        # each micro-batch's loss and tensor metrics go to the host right after its forward
        # (HostCopy) and are read once every backward is queued: no sync stalls the GPU here
        copies: list[tuple[HostCopy, list[str], dict[str, float]]] = []
        count = [0]

        def loss(mb: TrainBatch, index: int, output: Any) -> Any:
            logp, ent = output
            context = MicroBatch(
                batch=mb,
                index=index,
                count=count[0],
                global_num_loss_tokens=global_tokens,
                global_num_rows=global_rows,
                dp_size=self.data_parallel_size,
            )
            value, metrics = loss_fn(logp, ent if with_entropy else None, None, context)
            if value.dim() != 0:
                raise TrainingError(f"loss_fn must return a scalar loss; got {tuple(value.shape)}")
            if not value.requires_grad:
                value = value + logp.sum() * 0.0
            tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
            snapshot = torch.stack(
                [value.detach().float()]
                + [v.detach().float().reshape(()).to(value.device) for v in tensors.values()]
            )
            plain = {k: float(v) for k, v in metrics.items() if k not in tensors}
            copies.append((HostCopy(snapshot), list(tensors), plain))
            return value, torch.tensor(1, dtype=torch.int, device=self.device), {}

        mbs = self._micro_batches(batch, num_micro_batches, max_tokens)
        count[0] = len(mbs)
        self._run(
            loss, temperature=temperature, with_entropy=with_entropy, forward_only=False, mbs=mbs
        )
        total, sums = 0.0, dict[str, float]()
        for copy, names, plain in copies:
            row = copy.get().tolist()
            total += row[0]
            for k, x in [*zip(names, row[1:], strict=True), *plain.items()]:
                sums[k] = sums.get(k, 0.0) + x
        local = {k: v / max(count[0], 1) for k, v in sums.items()}
        return state.reduce_metrics(total, local, self.device)

    def optimizer_step(self) -> Metrics:
        if self._optimizer is None:
            raise TrainingError("the 'ref' engine has no optimizer; only actor engines train")
        self._finalize_grads()
        lr = self.config.lr * lr_factor(self.step, self.config)
        self._set_lr(lr, self._optimizer)
        if self._lean_step is not None:
            _, norm_value, reason = self._lean_step()
        else:
            norm_value, reason = self._megatron_step()
        self._ddp.zero_grad_buffer()  # LeanStep's grads are views of this buffer: zeroed too
        if self._lean_step is None:
            self._optimizer.zero_grad()
        self.step += 1
        return {"train/grad_norm": norm_value, "train/lr": lr, **skip_metrics(reason)}

    def _finalize_grads(self) -> None:
        """DP reduce(-scatter) of the summed gradients (and, under TP / PP, Megatron's extras)."""
        from megatron.core.distributed import finalize_model_grads

        p = self.parallel
        model_parallel = p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size
        if model_parallel == 1 and not self._tconfig.num_moe_experts:
            # what finalize_model_grads does here, without its walks over every module
            self._ddp.finish_grad_sync()
        else:
            finalize_model_grads([self._ddp])

    def _megatron_step(self) -> tuple[float, str | None]:
        """Megatron's own step, skipped (as the torch engine does) without a usable gradient.

        Megatron checks for inf / NaN only under fp16 loss scaling; in bf16 it would apply them.
        """
        peak = self._grad_peak()
        if not math.isfinite(peak):
            return float("nan"), "nonfinite_grad"
        if peak == 0.0:
            return 0.0, "zero_grad"
        ok, norm, _ = self._optimizer.step()
        return (float(norm) if norm is not None else float("nan")), None if ok else "nonfinite_grad"

    def _grad_peak(self) -> float:
        """max |gradient| over every rank's gradient buffers (inf / NaN when any is)."""
        buffers = [
            *getattr(self._ddp, "buffers", []),
            *getattr(self._ddp, "expert_parallel_buffers", []),
        ]
        grads = [b.grad_data for b in buffers] or [
            p.main_grad for p in self._ddp.parameters() if getattr(p, "main_grad", None) is not None
        ]
        peak = torch.zeros((), dtype=torch.float32, device=self.device)
        for g in grads:
            # max |g| without a buffer-sized temporary; a NaN propagates
            peak = torch.maximum(peak, torch.linalg.vector_norm(g.detach(), math.inf).float())
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return float(peak)

    # ---- state ----------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.shape is not None
        return state.named_weights(self.model, self.shape)

    def save(self, path: str | Path) -> None:
        state.save(self, Path(path))

    def load(self, path: str | Path) -> None:
        state.load(self, Path(path))

    def export_hf(self, path: str | Path) -> None:
        state.export_hf(self, Path(path))

    def offload(self) -> None:
        state.offload(self)

    def onload(self) -> None:
        state.onload(self)
