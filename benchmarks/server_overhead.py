"""What serving over HTTP costs the static engine: the GPU quickstart's requests, in-process
and through the embedded server.

    python benchmarks/server_overhead.py                    # one GPU: the quickstart's model shape
    python benchmarks/server_overhead.py --device cpu       # 2-core CPU
    python benchmarks/server_overhead.py --device cpu --rounds 1 --warmup 1   # smoke

The request pattern of one step of ``recipes/quickstart_gpu.yaml``: 128 first turns (16
prompts of 92 tokens, 8 requests each, 24 new tokens) sent at once, then 128 second turns
(each first turn's prompt and answer plus 17 tool tokens, 8 new tokens) sent 0.4 ms apart, as
the driver hands them out. Prompts are random tokens and EOS is ignored, so every run does the
same work. Two paths over the same model, each in a fresh process:

    in-process   ``StaticRunner`` fed directly (no HTTP): the engine's own cost, the bound
    http         ``python -m agentrl.inference.server`` and the real ``InferenceClient``

Per timed round: wall time, prefill forwards and their mean time, decode steps, and (http)
the CPU of the client's process and of the server's busiest threads: the engine thread and the HTTP thread share one GIL,
so what the HTTP thread spends is taken from the engine. The last line is the headline: the
in-process round over the http round (1.0: serving costs nothing; goal 0.5, within 2x).
Figures: docs/guides/inference.md, "Where that generation goes".
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GROUPS, GROUP_SIZE = 16, 8
PROMPT, FIRST_NEW, TOOL, SECOND_NEW = 92, 24, 17, 8
SPACING_S = 0.0004
COUNTERS = ("busy_s", "prefill_s", "decode_s", "prefill_forwards", "decode_steps")


def _prompts(rng: random.Random, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """A round's first-turn prompts and the tool tokens each second turn adds."""
    base = [[rng.randrange(3, vocab - 1) for _ in range(PROMPT)] for _ in range(GROUPS)]
    first = [base[i // GROUP_SIZE] for i in range(GROUPS * GROUP_SIZE)]
    tools = [[rng.randrange(3, vocab - 1) for _ in range(TOOL)] for _ in first]
    return first, tools


def _summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    out = {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}
    out["prefill_ms_each"] = round(1e3 * out["prefill_s"] / max(out["prefill_forwards"], 1), 2)
    return out


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    """The engine fed directly: rounds timed with its own counters."""
    from agentrl.inference.runner import ModelRunner
    from agentrl.inference.runner_types import RequestParams, RunnerRequest
    from agentrl.inference.static_runner import StaticRunner

    runner = StaticRunner(
        ModelRunner.Config(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            engine="static",
            max_batch_size=GROUPS * GROUP_SIZE * 2,
        )
    )
    runner.start()
    rng = random.Random(0)

    def submit(prompt: list[int], n: int, rid: str, seed: int) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        params = RequestParams(max_new_tokens=n, temperature=1.0, ignore_eos=True, seed=seed)
        runner.submit(
            RunnerRequest(rid=rid, input_ids=prompt, params=params, on_done=fut.set_result)
        )
        return fut

    def one_round(tag: str) -> None:
        first, tools = _prompts(rng, runner.vocab_size)
        futs = [submit(p, FIRST_NEW, f"{tag}a{i}", i) for i, p in enumerate(first)]
        answers = [f.result(timeout=600).output_ids for f in futs]
        futs = []
        for i, (p, a, t) in enumerate(zip(first, answers, tools, strict=True)):
            futs.append(submit(p + a + t, SECOND_NEW, f"{tag}b{i}", 1000 + i))
            time.sleep(SPACING_S)
        for f in futs:
            f.result(timeout=600)

    try:
        rounds = []
        for r in range(args.warmup + args.rounds):
            before, start = runner.info(), time.perf_counter()
            one_round(f"r{r}-")
            wall, after = time.perf_counter() - start, runner.info()
            if r >= args.warmup:
                rounds.append({"round_s": wall, **{k: after[k] - before[k] for k in COUNTERS}})
    finally:
        runner.shutdown()
    return _summary(rounds)


def over_http(args: argparse.Namespace) -> dict[str, Any]:
    """The embedded server in its own process, driven by the real client."""
    import psutil

    from agentrl.inference.client import InferenceClient
    from agentrl.inference.launch import ServerProcess
    from agentrl.inference.protocol import SamplingParams

    cfg = ServerProcess.Config(
        model=args.model,
        dtype=args.dtype,
        max_batch_size=GROUPS * GROUP_SIZE * 2,
        startup_timeout_s=600,
        extra_args=["--device", args.device, "--engine", "static", *args.server_args],
    )
    rng = random.Random(0)
    with ServerProcess(cfg) as server:
        proc = psutil.Process(server.pid)

        async def run() -> list[dict[str, float]]:
            client = InferenceClient([server.url])

            async def engine() -> dict[str, float]:
                info = (await client.http.get(server.url + "/get_server_info")).json()
                return {k: float(info["engine"][k]) for k in COUNTERS}

            async def gen(prompt: list[int], n: int, seed: int) -> list[int]:
                sampling = SamplingParams(
                    max_new_tokens=n, temperature=1.0, ignore_eos=True, seed=seed
                )
                return list((await client.generate(prompt, sampling)).output_ids)

            async def second(i: int, prompt: list[int]) -> None:
                await asyncio.sleep(SPACING_S * i)
                await gen(prompt, SECOND_NEW, 1000 + i)

            vocab = int(
                (await client.http.get(server.url + "/get_model_info")).json()["vocab_size"]
            )
            rounds = []
            try:
                for r in range(args.warmup + args.rounds):
                    first, tools = _prompts(rng, vocab)
                    before, cpu_before = await engine(), _thread_cpu(proc)
                    start, client_cpu = time.perf_counter(), time.process_time()
                    answers = await asyncio.gather(
                        *(gen(p, FIRST_NEW, i) for i, p in enumerate(first))
                    )
                    await asyncio.gather(
                        *(
                            second(i, p + a + t)
                            for i, (p, a, t) in enumerate(zip(first, answers, tools, strict=True))
                        )
                    )
                    wall = time.perf_counter() - start
                    client_cpu = time.process_time() - client_cpu
                    after, cpu_after = await engine(), _thread_cpu(proc)
                    if r >= args.warmup:
                        busiest = sorted(
                            (cpu_after[t] - cpu_before.get(t, 0.0) for t in cpu_after),
                            reverse=True,
                        )
                        rounds.append(
                            {
                                "round_s": wall,
                                **{k: after[k] - before[k] for k in COUNTERS},
                                "thread1_cpu_s": busiest[0],
                                "thread2_cpu_s": busiest[1] if len(busiest) > 1 else 0.0,
                                "client_cpu_s": client_cpu,
                            }
                        )
            finally:
                await client.aclose()
            return rounds

        return _summary(asyncio.run(run()))


def _thread_cpu(proc: Any) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--model", default="/tmp/agentrl_server_overhead_model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first (graph capture)")
    p.add_argument("--path", choices=("in-process", "http"), help=argparse.SUPPRESS)
    p.add_argument(
        "--server-args", nargs="*", default=[], help="extra flags for the http path's server"
    )
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.path:  # one path, in this (fresh) process
        result = in_process(args) if args.path == "in-process" else over_http(args)
        print(json.dumps(result))
        return
    if not Path(args.model, "config.json").exists():  # the quickstart's shape, random weights
        from agentrl.tiny import make_tiny_model

        make_tiny_model(
            args.model, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, dtype=args.dtype
        )
    results = {}
    for path in ("in-process", "http"):
        cmd = [sys.executable, __file__, "--path", path, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"{path} failed:\n{out.stderr[-3000:]}")
        results[path] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{path:>10}: {json.dumps(results[path])}", flush=True)
    bound, http = results["in-process"]["round_s"], results["http"]["round_s"]
    ratio = round(bound / http, 3)
    print(
        json.dumps(
            {
                "benchmark": f"the GPU quickstart's request round ({args.device}): in-process "
                "engine time over the time through the embedded server",
                "baseline": f"in-process StaticRunner: {bound:.4f} s a round",
                "ours": round(http, 4),
                "ratio": ratio,
                "goal": 0.5,
                "met": ratio >= 0.5,
            }
        )
    )


if __name__ == "__main__":
    main()
