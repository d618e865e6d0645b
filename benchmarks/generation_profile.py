"""Where a static-engine step goes: the engine in-process, its loop timed phase by phase.

    python benchmarks/generation_profile.py                     # one H200: the 337M Llama, bf16
    python benchmarks/generation_profile.py --device cpu --layers 2 --hidden 64 --heads 4 \
        --concurrency 8,32                                      # CPU smoke

Same model and request mix as ``generation.py`` (it builds the model if missing), but no HTTP:
``StaticRunner`` runs in this process and every request is submitted at once, so the figure
here minus the server's is what HTTP and request arrival cost. Per concurrency level, after a
warm-up round of the same requests (it captures the graphs), one timed round reports:

    tokens/s            in-process throughput
    prefills            how many prefill forwards, and how many requests each took
    per decode step     wall ms, split into launch (graph replay or eager forward), waiting
                        for a step's tokens (``device_wait``), host bookkeeping (``_append``:
                        tokens, stops, finishing rows; ``_record`` on the synchronous path,
                        its wait included), slot compaction (``_free``) and the state
                        rebuild (``_sync_rows``); device ms (CUDA events around the step)
    loop other          wall time outside prefill and decode (inbox, idle, GIL)

Then on CUDA: the pure replay time of one decode graph (64 rows, 256 positions) back to back,
and a ``torch.profiler`` table of one eager decode step (kernels per step, the costly ops).
Writes ``profile.json`` and ``profile.txt`` under ``--out``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation import ensure_model, requests_mix


class PhaseTimer:
    """Wraps some of a runner's methods (instance attributes) to sum their wall time."""

    def __init__(self, runner: Any, cuda: bool) -> None:
        self.runner, self.cuda = runner, cuda
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.prefill_sizes: list[int] = []
        self.events: list[tuple[Any, Any]] = []
        self.in_prefill = False
        for name in (
            "_prefill",
            "_decode",
            "_sync_rows",
            "_record",
            "_append",
            "_free",
            "_capture",
        ):
            self._wrap(name)
        self._wrap_step()
        admit = runner._admit_next

        def admit_logged(*a: Any) -> Any:
            taken = admit(*a)
            self.prefill_sizes.append(len(taken))
            return taken

        runner._admit_next = admit_logged

    def reset(self) -> None:
        self.wall.clear()
        self.calls.clear()
        self.prefill_sizes.clear()
        self.events.clear()

    def _wrap(self, name: str) -> None:
        fn = getattr(self.runner, name)

        def timed(*a: Any, **k: Any) -> Any:
            key = name
            if name == "_prefill":
                self.in_prefill = True
            elif self.in_prefill:  # a prefill's own _record/_sync_rows: not a decode step's
                key = name + "_in_prefill"
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if name == "_prefill":
                    self.in_prefill = False
                self.wall[key] += time.perf_counter() - start
                self.calls[key] += 1

        setattr(self.runner, name, timed)

    def _wrap_step(self) -> None:
        """The decode step's launch, device time from events around it, and the host's wait
        for a step's tokens (``_InFlight.read``; on the synchronous path it is in
        ``_record``)."""
        import torch

        from agentrl.inference import static_runner

        name = "_replay" if self.runner.use_graphs else "_step"
        fn = getattr(self.runner, name)

        def timed(*a: Any, **k: Any) -> Any:
            begin = end = None
            if self.cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                begin.record()
            start = time.perf_counter()
            out = fn(*a, **k)
            self.wall["launch"] += time.perf_counter() - start
            self.calls["launch"] += 1
            if self.cuda:
                end.record()
                self.events.append((begin, end))
            return out

        setattr(self.runner, name, timed)
        read = static_runner._InFlight.read

        def timed_read(step: Any) -> Any:
            start = time.perf_counter()
            if step.event is not None:
                step.event.synchronize()
            self.wall["device_wait"] += time.perf_counter() - start
            return read(step)

        static_runner._InFlight.read = timed_read  # type: ignore[method-assign]

    def summary(self, elapsed: float) -> dict[str, Any]:
        import torch

        steps = max(self.calls["_decode"], 1)
        if self.cuda:
            torch.cuda.synchronize()
        device_ms = [b.elapsed_time(e) for b, e in self.events]
        per_step = {
            k: round(1e3 * self.wall[k] / steps, 3)
            for k in (
                "_decode",
                "launch",
                "device_wait",
                "_append",
                "_record",
                "_free",
                "_sync_rows",
            )
        }
        per_step["device"] = round(sum(device_ms) / max(len(device_ms), 1), 3)
        busy = self.wall["_prefill"] + self.wall["_decode"]
        return {
            "elapsed_s": round(elapsed, 3),
            "decode_steps": self.calls["_decode"],
            "prefills": len(self.prefill_sizes),
            "prefill_sizes": self.prefill_sizes,
            "prefill_s": round(self.wall["_prefill"], 3),
            "decode_s": round(self.wall["_decode"], 3),
            "capture_s": round(self.wall["_capture"], 3),
            "loop_other_s": round(elapsed - busy, 3),
            "per_decode_step_ms": per_step,
        }


def one_round(runner: Any, reqs: list[tuple[list[int], int]], tag: str) -> tuple[float, int]:
    from agentrl.inference.runner_types import RequestParams, RunnerRequest

    futs: list[concurrent.futures.Future[Any]] = []
    start = time.perf_counter()
    for i, (prompt, n) in enumerate(reqs):
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        futs.append(fut)
        sp = RequestParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)
        runner.submit(
            RunnerRequest(rid=f"{tag}{i}", input_ids=prompt, params=sp, on_done=fut.set_result)
        )
    tokens = sum(len(f.result(timeout=600).output_ids) for f in futs)
    return time.perf_counter() - start, tokens


def device_figures(runner: Any, timer: PhaseTimer, lines: list[str]) -> dict[str, Any]:
    """Pure graph replay time, and a profiler table of one eager decode step (engine thread)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    rows = min(64, runner.cache.slots)

    def replay_time() -> float:
        key = (rows, 256, False)
        if key not in runner._graphs:
            runner._graphs[key] = runner._capture(*key)
        graph = runner._graphs[key][0]
        for _ in range(5):
            graph.replay()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(begin.elapsed_time(end) / 50)

    def eager_profile() -> str:
        with torch.inference_mode():
            for _ in range(3):
                runner._step(rows, 256, False)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                runner._step(rows, 256, False)
                torch.cuda.synchronize()
        events = prof.key_averages()
        kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
        out["eager_step_kernels"] = kernels
        table: str = events.table(sort_by="cuda_time_total", row_limit=30)
        return f"kernels in one eager decode step ({rows} rows): {kernels}\n{table}"

    out["attention"] = attention_backends(runner, lines)
    out["graph_replay_ms_64rows_256pos"] = round(runner.call(replay_time).result(), 3)
    lines.append(
        f"graph replay, {rows} rows, 256 positions: {out['graph_replay_ms_64rows_256pos']} ms"
    )
    lines.append(runner.call(eager_profile).result())
    return out


def attention_backends(runner: Any, lines: list[str]) -> dict[str, Any]:
    """SDPA's cuDNN and memory-efficient kernels on this model's shapes: the first call on
    each of a few fresh prefill shapes (new shapes are what a server's prefills meet), and
    the steady time of a decode-shaped call (64 rows, 1 query, 256 keys, additive mask)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, dim = runner.decoder.n_heads, runner.decoder.head_dim
    dt = runner.dtype

    def call(backend: Any, n: int, t: int, keys: int, reps: int) -> float:
        q = torch.randn(n, heads, t, dim, device="cuda", dtype=dt)
        k, v = (torch.randn(n, heads, keys, dim, device="cuda", dtype=dt) for _ in range(2))
        mask = torch.zeros(n, 1, t, keys, device="cuda", dtype=dt)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with sdpa_kernel([backend]):
            for _ in range(reps):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - start) / reps

    out: dict[str, Any] = {}
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for name, backend in backends.items():
        try:
            fresh = [call(backend, n, t, t, 1) for n, t in ((7, 93), (13, 61), (29, 117))]
            call(backend, 64, 1, 256, 3)
            steady = call(backend, 64, 1, 256, 100)
        except RuntimeError as exc:
            out[name] = f"failed: {exc}"[:200]
            continue
        out[name] = {
            "fresh_prefill_ms": [round(x, 2) for x in fresh],
            "decode_ms": round(steady, 4),
        }
    lines.append(f"attention kernels: {json.dumps(out)}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--concurrency", default="64,256")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--model", default="/tmp/agentrl_gen_bench_model")
    p.add_argument("--out", default="/tmp/agentrl_gen_profile")
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    levels = [int(x) for x in args.concurrency.split(",")]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    ensure_model(args)
    from agentrl.inference.runner import ModelRunner
    from agentrl.inference.static_runner import StaticRunner

    cfg = ModelRunner.Config(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        engine="static",
        max_batch_size=max(levels),
        max_seq_len=args.max_seq_len,
    )
    runner = StaticRunner(cfg)
    cuda = args.device.startswith("cuda")
    timer = PhaseTimer(runner, cuda)
    runner.start()
    vocab = runner.vocab_size
    results: dict[str, Any] = {}
    lines: list[str] = []
    for c in levels:
        reqs = requests_mix(c, vocab)
        one_round(runner, reqs, f"warm{c}-")
        timer.reset()
        elapsed, tokens = one_round(runner, reqs, f"c{c}-")
        summary = {"tokens_per_s": round(tokens / elapsed, 1), **timer.summary(elapsed)}
        results[f"c={c}"] = summary
        lines.append(f"c={c}: {json.dumps(summary)}")
        print(lines[-1], flush=True)
    if cuda:
        results["device"] = device_figures(runner, timer, lines)
    runner.shutdown()
    Path(args.out, "profile.json").write_text(json.dumps(results, indent=1))
    Path(args.out, "profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[len(levels) :]))


if __name__ == "__main__":
    main()
