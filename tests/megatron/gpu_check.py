"""GPU acceptance of the Megatron engine against the torch-native engine (not a pytest module).

    python tests/megatron/gpu_check.py single OUT_DIR          # 1 GPU
    python tests/megatron/gpu_check.py lean OUT_DIR            # 1 GPU: optimizer step only
    python tests/megatron/gpu_check.py compiled OUT_DIR        # 1 GPU: compile_layers vs eager
    torchrun --nproc-per-node 2 tests/megatron/gpu_check.py tp OUT_DIR   # 2 GPUs: TP=2 vs DP=2

single: same HF weights and batch; logprobs (fp32 and bf16), loss, grad norm and the loss after
one update, padded vs packed, save -> load -> identical next step, offload/onload, export_hf.
tp: TP=2 (both ranks get the whole batch) against TP=1 x DP=2 (each rank half the batch).
Prints every figure and writes them to OUT_DIR/<mode>.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "trainers")]
from test_torch_engine import make_batch, nll_loss  # noqa: E402

from agentrl.engine import EngineConfig  # noqa: E402
from agentrl.tiny import make_tiny_model  # noqa: E402
from trainers.engines import ENGINES  # noqa: E402
from trainers.engines.megatron.engine import MegatronConfig  # noqa: E402

RESULTS: dict[str, object] = {}


def record(key: str, value: object) -> None:
    RESULTS[key] = value
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{key}: {value}", flush=True)


def model(path: str) -> str:
    if int(os.environ.get("RANK", "0")) == 0 and not Path(path, "config.json").exists():
        make_tiny_model(
            path, arch="qwen2", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2
        )
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return path


def cfg(path: str, **kw: object) -> EngineConfig:
    base = dict(model_path=path, device="cuda", lr=1e-4, weight_decay=0.0, micro_batch_size=2)
    return EngineConfig(**{**base, **kw})  # type: ignore[arg-type]


def masked_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).max())


def train_step(engine, batch) -> dict[str, float]:  # type: ignore[no-untyped-def]
    m = engine.forward_backward(batch, nll_loss)
    return m | engine.optimizer_step()


def single(out: Path) -> None:
    path = model("/tmp/mg_tiny")
    batch = make_batch(seed=1, n_groups=4, group_size=4)
    mask = batch.attention_mask.float()
    mask[:, 0] = 0
    compare(path, batch, mask)
    lean(path, batch)
    state(path, batch)
    compiled(path, batch, mask)


def lean(path: str, batch) -> None:  # type: ignore[no-untyped-def]
    """LeanStep (the default) against Megatron's own optimizer step: three steps, same weights."""
    engines = []
    for on in (True, False):
        e = ENGINES.make(
            "megatron",
            config=cfg(path, dtype="bfloat16", max_grad_norm=0.5),
            options=MegatronConfig(lean_optimizer_step=on),
        )
        e.initialize()
        norms = [train_step(e, batch)["train/grad_norm"] for _ in range(3)]
        engines.append((e, norms))
    (a, na), (b, nb) = engines
    wa, wb = dict(a.named_weights()), dict(b.named_weights())
    diff = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    record("lean vs megatron step: grad norms", (na, nb))
    record("lean vs megatron step: max weight diff after 3 steps", diff)


def compiled(path: str, batch, mask) -> None:  # type: ignore[no-untyped-def]
    """compile_layers (whole decoder, compiled logprob chunks) against eager Megatron, bf16; and
    a NaN loss skipped on the device (fused Adam's found_inf) without touching the weights."""
    runs = {}
    for scope in ("eager", "decoder", "layer"):
        par = MegatronConfig(
            compile_layers=scope != "eager", compile_scope=scope if scope != "eager" else "decoder"
        )
        e = ENGINES.make("megatron", config=cfg(path, dtype="bfloat16"), options=par)
        e.initialize()
        lp, _ = e.compute_logprobs(batch)
        steps = [train_step(e, batch) for _ in range(3)]
        runs[scope] = (lp, [(m["train/loss"], m["train/grad_norm"]) for m in steps])
        if scope == "decoder":
            before = {k: v.clone() for k, v in e.named_weights()}
            nan = e.forward_backward(batch, lambda *a: (nll_loss(*a)[0] * float("nan"), {}))
            m = e.optimizer_step()
            after = dict(e.named_weights())
            record(
                "compiled: NaN loss -> skipped, reason",
                (nan["train/loss"], m["train/skipped_step"], m["train/skipped_nonfinite_grad"]),
            )
            record(
                "compiled: weights unchanged after the NaN step",
                all(torch.equal(before[k], after[k]) for k in before),
            )
            m = train_step(e, batch)
            record(
                "compiled: next step after NaN (loss, grad norm, skipped)",
                (m["train/loss"], m["train/grad_norm"], m["train/skipped_step"]),
            )
        del e
        torch.cuda.empty_cache()
    for scope in ("decoder", "layer"):
        record(
            f"compiled {scope} vs eager: logprob max abs diff",
            masked_diff(runs[scope][0], runs["eager"][0], mask),
        )
        record(
            f"compiled {scope} vs eager: (loss, grad norm) x 3 steps",
            (runs[scope][1], runs["eager"][1]),
        )


def compare(path: str, batch, mask) -> None:  # type: ignore[no-untyped-def]
    for dtype in ("float32", "bfloat16"):
        torch_e = ENGINES.make("torch", config=cfg(path, dtype=dtype))
        torch_e.initialize()
        mg = ENGINES.make("megatron", config=cfg(path, dtype=dtype))
        mg.initialize()
        lp_t, _ = torch_e.compute_logprobs(batch)
        lp_m, _ = mg.compute_logprobs(batch)
        record(f"{dtype}/logprob_max_abs_diff", masked_diff(lp_t, lp_m, mask))
        record(
            f"{dtype}/logprob_mean_abs_diff", float(((lp_t - lp_m).abs() * mask).sum() / mask.sum())
        )
        mt, mm = train_step(torch_e, batch), train_step(mg, batch)
        record(f"{dtype}/loss torch, megatron", (mt["train/loss"], mm["train/loss"]))
        record(f"{dtype}/grad_norm torch, megatron", (mt["train/grad_norm"], mm["train/grad_norm"]))
        mt2 = torch_e.forward_backward(batch, nll_loss)
        mm2 = mg.forward_backward(batch, nll_loss)
        record(
            f"{dtype}/loss after 1 update torch, megatron", (mt2["train/loss"], mm2["train/loss"])
        )
        torch_e.optimizer_step(), mg.optimizer_step()
        del torch_e, mg
        torch.cuda.empty_cache()
    # packed (THD + SDPA per sequence) vs padded, bf16
    padded = ENGINES.make("megatron", config=cfg(path, dtype="bfloat16"))
    padded.initialize()
    packed = ENGINES.make("megatron", config=cfg(path, dtype="bfloat16", packed=True))
    packed.initialize()
    a, b = padded.compute_logprobs(batch)[0], packed.compute_logprobs(batch)[0]
    record("bf16/packed_vs_padded_logprob_max_abs_diff", masked_diff(a, b, mask))
    record(
        "bf16/packed loss, padded loss",
        (train_step(packed, batch)["train/loss"], train_step(padded, batch)["train/loss"]),
    )


def state(path: str, batch) -> None:  # type: ignore[no-untyped-def]
    """save -> load -> the next step matches; offload/onload; export_hf."""
    padded = ENGINES.make("megatron", config=cfg(path, dtype="bfloat16"))
    padded.initialize()
    train_step(padded, batch)
    ckpt = tempfile.mkdtemp()
    padded.save(ckpt)
    nxt = train_step(padded, batch)
    resumed = ENGINES.make("megatron", config=cfg(path, dtype="bfloat16"))
    resumed.initialize()
    resumed.load(ckpt)
    again = train_step(resumed, batch)
    record(
        "resume step, loss uninterrupted vs resumed",
        (resumed.step, nxt["train/loss"], again["train/loss"]),
    )
    record(
        "resume grad_norm uninterrupted vs resumed",
        (nxt["train/grad_norm"], again["train/grad_norm"]),
    )
    before = resumed.compute_logprobs(batch)[0]
    used = torch.cuda.memory_allocated()
    resumed.offload()
    freed = used - torch.cuda.memory_allocated()
    resumed.onload()
    record(
        "offload freed MiB, logprobs equal after onload",
        (freed / 2**20, bool(torch.equal(before, resumed.compute_logprobs(batch)[0]))),
    )
    record("train after onload finite", train_step(resumed, batch)["train/loss"])
    export = tempfile.mkdtemp()
    resumed.export_hf(export)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    named = dict(resumed.named_weights())
    record(
        "export_hf tensors, max diff to named_weights",
        (
            len(named),
            max(
                float((hf.state_dict()[k].float() - v.float().cpu()).abs().max())
                for k, v in named.items()
            ),
        ),
    )


def tp(out: Path) -> None:
    from megatron.core import parallel_state

    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    path = model("/tmp/mg_tiny_tp")
    batch = make_batch(seed=1, n_groups=4, group_size=4)
    rank = torch.distributed.get_rank()
    results = {}
    for name, tp_size in (("tp2", 2), ("dp2", 1)):
        e = ENGINES.make(
            "megatron",
            config=cfg(path, dtype="bfloat16"),
            options=MegatronConfig(tensor_parallel_size=tp_size),
        )
        e.initialize()
        shard = batch if tp_size == 2 else batch.split(2)[e.data_parallel_rank]
        lp = e.compute_logprobs(shard)[0]
        m1 = train_step(e, shard)
        m2 = e.forward_backward(shard, nll_loss)
        results[name] = (m1["train/loss"], m1["train/grad_norm"], m2["train/loss"])
        record(f"{name} loss, grad_norm, loss after update", results[name])
        record(f"{name} logprob sum (this rank's rows)", float(lp.sum()))
        if tp_size == 2:
            record("tp2 named_weights count", len(dict(e.named_weights())))
        del e
        parallel_state.destroy_model_parallel()
        torch.cuda.empty_cache()
    if rank == 0:
        print("tp2 vs dp2 loss diff:", abs(results["tp2"][0] - results["dp2"][0]))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode in ("state", "lean"):  # lean: the optimizer-step checks only (lean vs Megatron, state)
        batch = make_batch(seed=1, n_groups=4, group_size=4)
        if mode == "lean":
            lean(model("/tmp/mg_tiny"), batch)
        state(model("/tmp/mg_tiny"), batch)
    else:
        if mode == "compiled":
            path = model("/tmp/mg_tiny")
            batch = make_batch(seed=1, n_groups=4, group_size=4)
            mask = batch.attention_mask.float()
            mask[:, 0] = 0
            compiled(path, batch, mask)
        else:
            {"single": single, "tp": tp}[mode](out)
    if int(os.environ.get("RANK", "0")) == 0:
        (out / f"{mode}.json").write_text(json.dumps(RESULTS, indent=1, default=str))
