"""LeanStep against Megatron's own optimizer step, on CPU (the same state, the same update).

Megatron's optimizer classes hard-code CUDA in a few places (``device='cuda'`` tensors, type
strings, the current stream). ``cuda_on_cpu`` below redirects those to the CPU for these tests
only, so that both steps run here on the same tiny GPTModel.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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


@pytest.fixture
def cuda_on_cpu(megatron_group: None) -> Iterator[None]:
    if torch.cuda.is_available():
        yield
        return
    patch = pytest.MonkeyPatch()
    patch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    with _CudaOnCpu():
        yield
    patch.undo()


def _build(path: Path, *, clip: float, fp16: bool = False, distributed: bool = True) -> Any:
    """(ddp, optimizer) for the tiny model: bf16 params, fp32 grads, Adam."""
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
    tc = make_config(shape, dtype=dtype, parallel=Parallelism(), recompute=False,
                     cpu_init=True, fused=False)  # fmt: skip
    model = build_model(shape, tc, vocab_multiple=128, pre_process=True, post_process=True)
    state.load_hf_weights(model, path, shape, MegatronConfig())
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed
    )
    ddp = DistributedDataParallel(tc, ddp_config, Float16Module(tc, model))
    opt_config = OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=clip,
                                 bf16=not fp16, fp16=fp16, params_dtype=dtype,
                                 use_distributed_optimizer=distributed)  # fmt: skip
    return ddp, get_megatron_optimizer(opt_config, [ddp])


def _backward(ddp: Any, seed: int, scale: float = 1.0) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 200, (2, 12), generator=gen)
    logits = ddp(ids, torch.arange(12).expand(2, 12), None)
    (logits.float().logsumexp(-1).mean() * scale).backward()
    ddp.finish_grad_sync()


def _params(ddp: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in ddp.named_parameters()}


@pytest.mark.parametrize("clip", [1e-3, 1e3], ids=["clipped", "unclipped"])
def test_lean_step_equals_megatron_step(
    cuda_on_cpu: None, tiny_models: dict[str, Path], clip: float
) -> None:
    from trainers.engines.megatron.optim import LeanStep, unsupported

    ours, theirs = _build(tiny_models["llama"], clip=clip), _build(tiny_models["llama"], clip=clip)
    assert unsupported(ours[1]) is None
    lean = LeanStep(ours[1], clip)
    for seed in range(3):  # Adam state carries over: three steps, three different batches
        for ddp, _ in (ours, theirs):
            _backward(ddp, seed)
        stepped, norm, reason = lean()
        ok, their_norm, _ = theirs[1].step()
        assert (stepped, reason, ok) == (True, None, True)
        assert norm == pytest.approx(their_norm, rel=1e-5)
        ours[0].zero_grad_buffer()  # as the engine: the attached grad views are zeroed with it
        theirs[0].zero_grad_buffer()
        theirs[1].zero_grad()
    a, b = _params(ours[0]), _params(theirs[0])
    before = _params(_build(tiny_models["llama"], clip=clip)[0])
    assert any(not torch.equal(a[n], before[n]) for n in a)  # the steps did move the weights
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("grad", ["zero", "nan"])
def test_lean_step_leaves_weights_alone_without_a_usable_gradient(
    cuda_on_cpu: None, tiny_models: dict[str, Path], grad: str
) -> None:
    from trainers.engines.megatron.optim import LeanStep

    ddp, opt = _build(tiny_models["llama"], clip=1.0)
    lean = LeanStep(opt, 1.0)
    _backward(ddp, 0, scale=0.0 if grad == "zero" else float("nan"))
    before = copy.deepcopy(_params(ddp))
    stepped, norm, reason = lean()
    assert not stepped
    assert reason == ("zero_grad" if grad == "zero" else "nonfinite_grad")
    assert (norm == 0.0) if grad == "zero" else (norm != norm)
    after = _params(ddp)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(not s for s in (o.optimizer.state for o in opt.chained_optimizers))  # no Adam state


def test_lean_step_says_why_it_does_not_apply(
    cuda_on_cpu: None, tiny_models: dict[str, Path]
) -> None:
    from trainers.engines.megatron.optim import unsupported

    _, fp16 = _build(tiny_models["llama"], clip=1.0, fp16=True)
    assert "loss scaler" in (unsupported(fp16) or "")
    _, plain = _build(tiny_models["llama"], clip=1.0, distributed=False)
    assert "DistributedOptimizer" in (unsupported(plain) or "")
