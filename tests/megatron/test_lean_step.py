"""LeanStep against Megatron's own optimizer step, on CPU (the same state, the same update).

One rank here; two gloo ranks (DP=2, then TP=2) in ``lean_worker.py``. Megatron's optimizer
runs on CPU through ``cpu_optim.cuda_on_cpu`` (tests only). ``fused``: torch's fused AdamW
inside (the engine's default), where LeanStep skips a bad step on the device; otherwise the
foreach AdamW, where it decides on the host.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cpu_optim import backward, build, cuda_on_cpu, params


@pytest.fixture
def on_cpu(megatron_group: None) -> Iterator[None]:
    with cuda_on_cpu():
        yield


def _steps(
    path: Path, clip: float, seeds: range, tp: int = 1, fused: bool = True
) -> tuple[dict, dict, list]:
    """Weights after LeanStep and after Megatron's step from the same start and batches."""
    from trainers.engines.megatron.optim import LeanStep, unsupported

    ours = build(path, clip=clip, tp=tp, fused=fused)
    theirs = build(path, clip=clip, tp=tp, fused=fused)
    assert unsupported(ours[1]) is None
    lean, norms = LeanStep(ours[1], clip), []
    assert lean.skips_on_device() == fused
    for seed in seeds:  # Adam state carries over: several steps, different batches
        for ddp, _ in (ours, theirs):
            backward(ddp, seed)
        stepped, norm, reason = lean()
        ok, their_norm, _ = theirs[1].step()
        assert (stepped, reason, ok) == (True, None, True)
        norms.append((norm, their_norm))
        ours[0].zero_grad_buffer()  # as the engine: the attached grad views are zeroed with it
        theirs[0].zero_grad_buffer()
        theirs[1].zero_grad()
    return params(ours[0]), params(theirs[0]), norms


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("clip", [1e-3, 1e3], ids=["clipped", "unclipped"])
def test_lean_step_equals_megatron_step(
    on_cpu: None, tiny_models: dict[str, Path], clip: float, fused: bool
) -> None:
    a, b, norms = _steps(tiny_models["llama"], clip, range(3), fused=fused)
    for ours, theirs in norms:
        assert ours == pytest.approx(theirs, rel=1e-5)
    before = params(build(tiny_models["llama"], clip=clip)[0])
    assert any(not torch.equal(a[n], before[n]) for n in a)  # the steps did move the weights
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("grad", ["zero", "nan"])
def test_lean_step_leaves_weights_alone_without_a_usable_gradient(
    on_cpu: None, tiny_models: dict[str, Path], grad: str, fused: bool
) -> None:
    from trainers.engines.megatron.optim import LeanStep

    ddp, opt = build(tiny_models["llama"], clip=1.0, fused=fused)
    lean = LeanStep(opt, 1.0)
    backward(ddp, 0, scale=0.0 if grad == "zero" else float("nan"))
    before = params(ddp)
    stepped, norm, reason = lean()
    assert not stepped
    assert reason == ("zero_grad" if grad == "zero" else "nonfinite_grad")
    assert (norm == 0.0) if grad == "zero" else (norm != norm)
    after = params(ddp)
    assert all(torch.equal(before[n], after[n]) for n in before)
    for inner in (o.optimizer for o in opt.chained_optimizers):
        # foreach: never stepped, no state; fused: the kernel ran with found_inf set and left
        # the (fresh) moments and the step count at zero
        for s in inner.state.values():
            assert fused
            assert float(s["step"]) == 0.0
            assert not s["exp_avg"].any() and not s["exp_avg_sq"].any()
        assert not hasattr(inner, "found_inf")  # not left behind for Megatron's own step
    # and the next good gradient steps as usual (the bad one left nothing to undo)
    ddp.zero_grad_buffer()
    backward(ddp, 1)
    stepped, norm, reason = lean()
    assert (stepped, reason) == (True, None) and norm > 0
    assert any(not torch.equal(before[n], v) for n, v in params(ddp).items())


def test_lean_step_says_why_it_does_not_apply(on_cpu: None, tiny_models: dict[str, Path]) -> None:
    from trainers.engines.megatron.optim import unsupported

    _, fp16 = build(tiny_models["llama"], clip=1.0, fp16=True)
    assert "loss scaler" in (unsupported(fp16) or "")
    _, plain = build(tiny_models["llama"], clip=1.0, distributed=False)
    assert "DistributedOptimizer" in (unsupported(plain) or "")


@pytest.mark.parametrize("tp", [1, 2], ids=["dp2", "tp2"])
def test_lean_step_equals_megatron_step_on_two_ranks(
    tiny_models: dict[str, Path], tmp_path: Path, tp: int
) -> None:
    """DP=2 (sharded master weights, grad reduce-scatter, param all-gather) and TP=2."""
    import lean_worker
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (port, str(tiny_models["qwen2"]), str(tmp_path), tp)
    mp.start_processes(lean_worker.run, args=args, nprocs=2, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for res in results:
        for ours, theirs in res["norms"]:
            assert ours == pytest.approx(theirs, rel=1e-5)
        assert any(not torch.equal(res["ours"][n], res["start"][n]) for n in res["ours"])
        for name in res["ours"]:
            torch.testing.assert_close(res["ours"][name], res["theirs"][name], rtol=0, atol=0)
    names = results[0]["ours"]
    if tp == 1:  # data parallel: both ranks hold the whole, identical model after the gather
        assert all(torch.equal(results[0]["ours"][n], results[1]["ours"][n]) for n in names)
    else:  # tensor parallel: each rank its own slice
        assert any(not torch.equal(results[0]["ours"][n], results[1]["ours"][n]) for n in names)
