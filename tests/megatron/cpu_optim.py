"""Megatron's DDP + distributed optimizer on CPU, for the optimizer-step tests (tests only).

Megatron's optimizer classes hard-code CUDA in a few places (``device='cuda'`` tensors, type
strings, the current stream). ``cuda_on_cpu()`` redirects those to the CPU while it is active;
``build`` makes a (DDP, optimizer) pair for a tiny HF model; ``backward`` feeds it a gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class _CudaOnCpu(TorchFunctionMode):
    """``device='cuda'`` -> CPU; ``tensor.type()`` reports a CUDA type (Megatron checks it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if "cuda" in str(kwargs.get("device", "")):
            kwargs["device"] = "cpu"
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and isinstance(out, str):
            out = out if ".cuda." in out else out.replace("torch.", "torch.cuda.", 1)
        return out


class _Stream:
    def wait_event(self, event: Any) -> None: ...

    def wait_stream(self, stream: Any) -> None: ...


@contextlib.contextmanager
def cuda_on_cpu() -> Iterator[None]:
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.current_device, torch.cuda.current_stream
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.current_stream = lambda *a: _Stream()  # type: ignore[assignment,return-value]
    try:
        with _CudaOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.current_stream = saved


def build(
    path: Path | str,
    *,
    clip: float,
    tp: int = 1,
    fp16: bool = False,
    distributed: bool = True,
    fused: bool = False,
) -> tuple[Any, Any]:
    """(ddp, optimizer) for the tiny model on this rank: bf16 params, fp32 grads, Adam.

    ``fused``: torch's fused AdamW inside Megatron's optimizer, as the engine sets it up.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from transformers import AutoConfig

    from trainers.engines.megatron import state
    from trainers.engines.megatron.config import MegatronConfig
    from trainers.engines.megatron.model import Parallelism, build_model, model_shape
    from trainers.engines.megatron.model import transformer_config as make_config

    dtype = torch.float16 if fp16 else torch.bfloat16
    shape = model_shape(AutoConfig.from_pretrained(path))
    tc = make_config(
        shape,
        dtype=dtype,
        parallel=Parallelism(tensor=tp),
        recompute=False,
        cpu_init=True,
        fused=False,
    )
    model = build_model(shape, tc, vocab_multiple=128, pre_process=True, post_process=True)
    state.load_hf_weights(model, str(path), shape, MegatronConfig(tensor_parallel_size=tp))
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed
    )
    ddp = DistributedDataParallel(tc, ddp_config, Float16Module(tc, model))
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-2,
        weight_decay=0.1,
        clip_grad=clip,
        bf16=not fp16,
        fp16=fp16,
        params_dtype=dtype,
        use_distributed_optimizer=distributed,
    )
    optimizer = get_megatron_optimizer(opt_config, [ddp])
    if fused:
        from trainers.engines.megatron.engine import _use_fused_torch_adam

        _use_fused_torch_adam(optimizer)
    return ddp, optimizer


def backward(ddp: Any, seed: int, scale: float = 1.0) -> None:
    """A loss on 2 random rows (seeded), backward, and the gradients finalised over the ranks."""
    from megatron.core.distributed import finalize_model_grads

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 200, (2, 12), generator=gen)
    logits = ddp(ids, torch.arange(12).expand(2, 12), None)
    (logits.float().logsumexp(-1).mean() * scale).backward()
    finalize_model_grads([ddp])


def params(ddp: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in ddp.named_parameters()}
