"""Training throughput of the engines on one GPU: tokens/s, MFU and peak memory, side by side.

    python benchmarks/engine_throughput.py                       # ~370M Llama, seq 2048, batch 8
    python benchmarks/engine_throughput.py --layers 4 --steps 3  # quick
    python benchmarks/engine_throughput.py --rounds 3            # interleaved, median per engine
    python benchmarks/engine_throughput.py --device cpu --engines torch,torch-compile \
        --layers 2 --hidden 64 --heads 4 --seq 64 --batch 2 --model /tmp/tiny_bench  # smoke

Builds one Llama-shaped model with ``agentrl.tiny.make_tiny_model`` (hidden 1024, 22 layers,
16 heads, FFN 4096, the tiny tokenizer's ~1k vocabulary: ~370M parameters), then runs each
engine in its own process (clean peak-memory figures) on the same bf16 training step: one
``forward_backward`` over ``batch`` rows of ``seq`` tokens (one micro-batch, NLL on every
token) and one ``optimizer_step``. Reported after ``warmup`` steps, over ``steps`` steps:

    tokens/s   batch * seq * steps / wall time (CUDA synchronised)
    MFU        achieved FLOP/s / peak, with FLOP/token = 6 * N (N = parameters without the
               embedding) + 6 * layers * hidden * seq (causal attention, forward + backward)
    peak GiB   torch.cuda.max_memory_allocated

Engines: ``torch`` (transformers + SDPA, autocast bf16, fp32 master weights), ``torch-compile``
(the same with every HF decoder layer ``torch.compile``d), ``megatron``
(GPTModel, local spec with SDPA core attention, bf16 params + fp32 distributed Adam) and
``megatron-local`` (Megatron's own unfused local attention, for reference),
``megatron-compile`` (``megatron`` with its decoder ``torch.compile``d as one graph, the
logprob chunks compiled too), ``megatron-compile-layer`` (each decoder layer compiled alone:
the engine's ``compile_scope=layer``, for comparison) and
``megatron-compile-foreach`` (the same with torch's foreach AdamW instead of the fused one) and
``megatron-compile-max`` (the layers compiled with ``max-autotune-no-cudagraphs``) and
``megatron-compile-cg`` (``reduce-overhead``: each compiled layer replayed as a CUDA graph).
``megatron-compile-max-stock`` is ``megatron-compile-max`` with Megatron's own optimizer step
instead of the engine's ``LeanStep`` (an ablation).
The default list is ``torch,torch-compile,megatron,megatron-compile,megatron-compile-max``
(``megatron-compile-max`` autotunes its kernels first: about two minutes on an H200).

The Megatron step is host-bound, so its figures move with the host's load: ``--rounds N``
runs the whole list N times, interleaved, and reports each engine's median and range (every
run is in ``--json``). ``--device cpu`` runs the torch engines in fp32 on the CPU (peak memory
is then the process's peak RSS, no MFU): a smoke test of the script, not a figure to quote.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
BASELINES = ("torch", "torch-compile")
ENGINE_NAMES = [
    "torch",
    "torch-compile",
    "megatron",
    "megatron-local",
    "megatron-compile",
    "megatron-compile-layer",
    "megatron-compile-foreach",
    "megatron-compile-max",
    "megatron-compile-max-stock",
    "megatron-compile-cg",
]
DEFAULT_ENGINES = "torch,torch-compile,megatron,megatron-compile,megatron-compile-max"
COMPILE_MODES = {"max": "max-autotune-no-cudagraphs", "cg": "reduce-overhead"}


def _batch(rows: int, seq: int, vocab: int):  # type: ignore[no-untyped-def]
    import torch

    from agentrl.batch import TrainBatch
    from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup

    gen = torch.Generator().manual_seed(0)
    trajs = []
    for _ in range(rows):
        ids = torch.randint(10, vocab, (seq,), generator=gen).tolist()
        s = Segment()
        s.extend_prompt(ids[:1])
        s.extend_generated(ids[1:], [0.0] * (seq - 1), 0)
        trajs.append(Trajectory(sample=Sample(env_id="bench"), segments=[s], reward=0.0))
    return TrainBatch.from_groups([TrajectoryGroup(uid="b", trajectories=trajs)], pad_token_id=0)


def _nll(logprobs, entropy, values, mb):  # type: ignore[no-untyped-def]
    loss = -(logprobs * mb.batch.loss_mask).sum() / max(mb.global_num_loss_tokens, 1.0)
    return loss, {}


def _profile(engine, batch) -> None:  # type: ignore[no-untyped-def]
    """Print the CUDA kernels that took most time in one training step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.forward_backward(batch, _nll)
        engine.optimizer_step()
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=14, max_name_column_width=60
    )
    print(table, file=sys.stderr, flush=True)


def run_engine(args: argparse.Namespace) -> dict[str, float | str]:
    """One engine in this process: time ``args.steps`` training steps; returns the figures."""
    import torch
    from transformers import AutoConfig

    from agentrl.engine import EngineConfig
    from trainers.engines import ENGINES

    cuda = args.device == "cuda"
    hf = AutoConfig.from_pretrained(args.model)
    cfg = EngineConfig(
        model_path=args.model,
        dtype="bfloat16" if cuda else "float32",
        device=args.device,
        lr=1e-5,
        micro_batch_size=args.batch,
        logprob_chunk_tokens=4096,
    )
    if args.engine in ("torch", "torch-compile"):
        engine = ENGINES.make("torch", config=cfg)
    else:
        from trainers.engines.megatron.config import MegatronConfig

        parts = set(args.engine.split("-")[1:])
        mode = next((COMPILE_MODES[p] for p in parts if p in COMPILE_MODES), "default")
        par = MegatronConfig(
            sdpa_attention="local" not in parts,
            compile_layers="compile" in parts,
            compile_mode=mode,
            compile_scope="layer" if "layer" in parts else "decoder",
            fused_adam="foreach" not in parts,
            lean_optimizer_step="stock" not in parts,
        )
        engine = ENGINES.make("megatron", config=cfg, options=par)
    engine.initialize()
    if args.engine == "torch-compile":  # the HF model's decoder layers, as compile_layers does
        for layer in engine.scorer.model.model.layers:  # type: ignore[attr-defined]
            layer.compile()
    batch = _batch(args.batch, args.seq, hf.vocab_size)
    for _ in range(args.warmup):
        engine.forward_backward(batch, _nll)
        engine.optimizer_step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = engine.forward_backward(batch, _nll)["train/loss"]
        engine.optimizer_step()
    sync()
    elapsed = time.perf_counter() - start
    if args.profile:
        _profile(engine, batch)
    tokens = args.batch * args.seq * args.steps
    n = sum(t.numel() for name, t in engine.named_weights() if "embed_tokens" not in name)
    flops_per_token = 6 * n + 6 * hf.num_hidden_layers * hf.hidden_size * args.seq
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), 989.0)
    return {
        "engine": args.engine,
        "tokens_per_s": tokens / elapsed,
        "mfu": tokens / elapsed * flops_per_token / (peak * 1e12) if cuda else float("nan"),
        # on CPU: the process's peak resident memory (ru_maxrss is in KiB on Linux)
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "step_s": elapsed / args.steps,
        "loss": loss,
        "params_non_embedding": n,
        "device": name,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--engines", default=DEFAULT_ENGINES)
    p.add_argument("--profile", action="store_true", help="print each engine's top CUDA kernels")
    p.add_argument("--model", default="/tmp/agentrl_bench_model")
    p.add_argument("--engine", help="run one engine in this process (used by the driver)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--rounds", type=int, default=1, help="run the engine list this many times, interleaved"
    )
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the torch engines")
    args = p.parse_args()
    asked = [args.engine] if args.engine else args.engines.split(",")
    unknown = [e for e in asked if e not in ENGINE_NAMES]
    if unknown:
        p.error(f"unknown engine(s) {unknown}; pick from {', '.join(ENGINE_NAMES)}")
    if args.engine:
        print("RESULT " + json.dumps(run_engine(args)), flush=True)
        return
    from agentrl.tiny import make_tiny_model

    if not Path(args.model, "config.json").exists():
        make_tiny_model(
            args.model,
            arch="llama",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.heads,
            vocab_size=1024,
        )
    results = []
    for round_ in range(args.rounds):
        for engine in args.engines.split(","):
            r = _run_one(engine, args)
            if r is None:
                continue
            results.append({**r, "round": round_})
            print(
                f"round {round_}: {engine}: {r['tokens_per_s']:.0f} tokens/s, "
                f"{r['step_s'] * 1e3:.0f} ms/step, {r['peak_gib']:.1f} GiB",
                flush=True,
            )
            if args.json:  # kept up to date: a run cut short still leaves what it measured
                Path(args.json).write_text(json.dumps(results, indent=1))
    _print_table(results, args)


def _run_one(engine: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """One engine in a fresh process; its figures, or None (and its output) when it failed."""
    cmd = [sys.executable, __file__, "--engine", engine, "--model", args.model]
    cmd += [f"--{k}={getattr(args, k)}" for k in ("seq", "batch", "steps", "warmup", "device")]
    cmd += ["--profile"] if args.profile else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if args.profile:
        start = proc.stderr.find("----")
        print(f"{engine} top CUDA kernels:\n{proc.stderr[max(start - 200, 0) :][:5000]}")
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        print(f"{engine} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}", flush=True)
        return None
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def _print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Per engine: the median over rounds (and the range when there were several rounds)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        runs.setdefault(r["engine"], []).append(r)
    speed = {e: statistics.median(x["tokens_per_s"] for x in rs) for e, rs in runs.items()}
    print(
        f"{'engine':20} {'tokens/s':>10} {'range':>15} {'MFU':>6} {'peak GiB':>9} "
        f"{'vs torch':>9} {'vs torch-compile':>17} {'loss':>8}"
    )
    for engine, rs in runs.items():
        lo, hi = min(x["tokens_per_s"] for x in rs), max(x["tokens_per_s"] for x in rs)
        spread = f"{lo:.0f}-{hi:.0f}" if len(rs) > 1 else "-"
        ratios = [f"{speed[engine] / speed[b]:.2f}x" if b in speed else "-" for b in BASELINES]
        mfu = statistics.median(x["mfu"] for x in rs)
        mfu_text = f"{mfu:.1%}" if mfu == mfu else "-"  # NaN on CPU
        print(
            f"{engine:20} {speed[engine]:10.0f} {spread:>15} {mfu_text:>6} "
            f"{max(x['peak_gib'] for x in rs):9.1f} {ratios[0]:>9} {ratios[1]:>17} "
            f"{rs[-1]['loss']:8.4f}"
        )
    if results:
        print(
            f"model: {results[0]['params_non_embedding'] / 1e6:.0f}M non-embedding params, "
            f"seq {args.seq}, batch {args.batch}, {results[0]['device']}, "
            f"{args.rounds} round(s), median per engine"
        )


if __name__ == "__main__":
    main()
