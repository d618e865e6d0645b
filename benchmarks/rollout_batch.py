"""Wall time of one RL step's rollout batch against one embedded server, per client transport.

    python benchmarks/rollout_batch.py                      # 16 groups x 8, CPU server, 30 batches
    python benchmarks/rollout_batch.py --device cuda --batches 30

The batch is the GPU quickstart's (``recipes/quickstart_gpu.yaml``): ``--groups`` prompts of
``arith/Calculator-v0`` x ``--group-size`` tool-calling rollouts, up to 3 turns of 24 new
tokens, all in flight at once through one ``InferenceClient`` (the path the driver uses). The
server runs the tiny quickstart model in its own process.

Each transport (``InferenceClient.Config.transport``) gets one long-lived client (as a run's
``Fleet`` keeps one) and one warm-up batch; then batches alternate between them on the same
server: ``aiohttp`` (the default) and ``httpx2`` (the baseline, the client's transport before
it). Per-batch times are bimodal on a shared machine, so the script times ``--batches``
(>= 30) of each and prints the median and the interquartile range, then every batch's time. The last line is JSON; its ratio is the
baseline's median over ours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample

OURS, BASELINE = "aiohttp", "httpx2"
GOAL = 1.0  # ours no slower than the baseline


async def _batch(
    client: InferenceClient, args: argparse.Namespace, template: ChatTemplate, seed: int
) -> tuple[float, float]:
    cfg = CollectorConfig(
        group_size=args.group_size,
        max_turns=3,
        max_tokens=192,
        max_new_tokens=24,
        agent="tool_calling",
        temperature=1.0,
    )
    samples = [
        Sample(env_id="arith/Calculator-v0", seed=seed * 1000 + i, env_kwargs={"digits": 1})
        for i in range(args.groups)
    ]
    collector = RolloutCollector(cfg, client, template)
    start = time.perf_counter()
    groups = [g async for g in collector.stream(samples)]
    wall = time.perf_counter() - start
    return wall, RolloutCollector.metrics(groups)["rollout/llm_time_mean_s"]


async def _run(
    url: str, args: argparse.Namespace, template: ChatTemplate
) -> dict[str, list[tuple[float, float]]]:
    """One long-lived client per transport (as a run's Fleet keeps one), batches alternating."""
    clients = {
        name: InferenceClient([url], InferenceClient.Config(transport=name))
        for name in (OURS, BASELINE)
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    try:
        for client in clients.values():
            await _batch(client, args, template, seed=0)  # warm-up
        for b in range(args.batches):
            order = list(clients.items()) if b % 2 == 0 else list(clients.items())[::-1]
            for name, client in order:
                results[name].append(await _batch(client, args, template, seed=b + 1))
    finally:
        for client in clients.values():
            await client.aclose()
    return results


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=30, help="timed batches per transport (>= 30)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.batches < 4:
        p.error(
            f"--batches must be >= 4 for quartiles (30 or more is the habit), got {args.batches}"
        )
    model = make_tiny_model(
        Path(tempfile.mkdtemp(prefix="agentrl-bench-")) / "model",
        arch="qwen2",
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
    )
    template = ChatTemplate.from_pretrained(model)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    cfg = ServerProcess.Config(
        model=str(model), dtype=dtype, max_batch_size=256, extra_args=["--device", args.device]
    )
    with ServerProcess(cfg) as server:
        results = asyncio.run(_run(server.url, args, template))
    n = args.groups * args.group_size
    print(
        f"{n} tool-calling rollouts per batch, one embedded server on {args.device}, "
        f"{args.batches} batches per transport"
    )
    print(f"{'transport':10} {'median':>8} {'IQR (q1-q3)':>14} {'range':>14} {'llm_time/traj':>14}")
    stats = {}
    for name, rows in results.items():
        walls = [w for w, _ in rows]
        q1, q2, q3 = stats[name] = _quartiles(walls)
        llm = statistics.mean(t for _, t in rows)
        print(
            f"{name:10} {q2:7.2f}s {q1:6.2f}-{q3:.2f}s {min(walls):6.2f}-{max(walls):.2f}s "
            f"{llm:13.2f}s"
        )
    for name, rows in results.items():
        print(f"{name} batches (s): " + " ".join(f"{w:.2f}" for w, _ in rows))
    (b1, b2, b3), (o1, o2, o3) = stats[BASELINE], stats[OURS]
    print(
        json.dumps(
            {
                "benchmark": f"rollout_batch: median wall of one {n}-rollout batch, {args.batches} "
                f"batches per transport, server on {args.device}",
                "baseline": f"httpx2 transport {b2:.2f} s (IQR {b1:.2f}-{b3:.2f})",
                "ours": f"aiohttp transport {o2:.2f} s (IQR {o1:.2f}-{o3:.2f})",
                "ratio": round(b2 / o2, 2),
                "goal": f">= {GOAL:g}",
                "met": b2 / o2 >= GOAL,
            }
        )
    )


if __name__ == "__main__":
    main()
