"""Wall time of one RL step's rollout batch against one embedded server, per HTTP client library.

    python benchmarks/rollout_batch.py                      # 16 groups x 8, CPU server
    python benchmarks/rollout_batch.py --device cuda --batches 5

The batch is the GPU quickstart's (``recipes/quickstart_gpu.yaml``): ``--groups`` prompts of
``arith/Calculator-v0`` x ``--group-size`` tool-calling rollouts, up to 3 turns of 24 new
tokens, all in flight at once through one ``InferenceClient`` (the path the driver uses). The
server runs the tiny quickstart model in its own process.

Each library gets one long-lived client (as a run's ``Fleet`` keeps one), one warm-up batch,
then batches alternate between the libraries on the same server: ``httpx2`` (what agentrl uses) and, when it is installed, ``httpx`` 0.28 (the baseline:
its httpcore 1.0.9 pool rescans every pooled connection for every queued request, a cost that
grows with the square of the requests in flight). Printed per library: the median batch wall
time, its range, and the mean time a trajectory spent waiting on the server (``llm_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import agentrl.inference.client as client_module
from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample


def _libraries() -> dict[str, Any]:
    libs = {"httpx2": importlib.import_module("httpx2")}
    try:
        libs["httpx"] = importlib.import_module("httpx")
    except ImportError:
        print("httpx is not installed: no baseline (pip install 'httpx==0.28.*' to add it)")
    return libs


async def _batch(
    client: InferenceClient, args: argparse.Namespace, template: ChatTemplate, seed: int
) -> tuple[float, float]:
    cfg = CollectorConfig(group_size=args.group_size, max_turns=3, max_tokens=192,
                          max_new_tokens=24, agent="tool_calling", temperature=1.0)  # fmt: skip
    samples = [Sample(env_id="arith/Calculator-v0", seed=seed * 1000 + i, env_kwargs={"digits": 1})
               for i in range(args.groups)]  # fmt: skip
    collector = RolloutCollector(cfg, client, template)
    start = time.perf_counter()
    groups = [g async for g in collector.stream(samples)]
    wall = time.perf_counter() - start
    return wall, RolloutCollector.metrics(groups)["rollout/llm_time_mean_s"]


async def _run(
    url: str, args: argparse.Namespace, template: ChatTemplate, libs: dict[str, Any]
) -> dict[str, list[tuple[float, float]]]:
    """One long-lived client per library (as a run's Fleet keeps one), batches alternating."""
    clients = {}
    for name, lib in libs.items():
        client_module.httpx2 = lib  # the library the client is built on
        clients[name] = InferenceClient([url])
    client_module.httpx2 = libs["httpx2"]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in libs}
    try:
        for client in clients.values():
            await _batch(client, args, template, seed=0)  # warm-up
        for b in range(args.batches):
            for name, client in clients.items():
                results[name].append(await _batch(client, args, template, seed=b + 1))
    finally:
        for client in clients.values():
            await client.aclose()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=3, help="timed batches per library")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    libs = _libraries()
    model = make_tiny_model(Path(tempfile.mkdtemp(prefix="agentrl-bench-")) / "model",
                            arch="qwen2", hidden_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2)  # fmt: skip
    template = ChatTemplate.from_pretrained(model)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    cfg = ServerProcess.Config(model=str(model), dtype=dtype, max_batch_size=256,
                               extra_args=["--device", args.device])  # fmt: skip
    with ServerProcess(cfg) as server:
        results = asyncio.run(_run(server.url, args, template, libs))
    n = args.groups * args.group_size
    print(f"{n} tool-calling rollouts per batch, one embedded server on {args.device}")
    print(f"{'client':8} {'batch wall (median)':>20} {'range':>14} {'llm_time/traj':>14}")
    for name, rows in results.items():
        walls = [w for w, _ in rows]
        llm = statistics.mean(t for _, t in rows)
        print(f"{name:8} {statistics.median(walls):19.2f}s {min(walls):6.2f}-{max(walls):.2f}s "
              f"{llm:13.2f}s")  # fmt: skip
    if "httpx" in results:
        ratio = statistics.median(w for w, _ in results["httpx"]) / statistics.median(
            w for w, _ in results["httpx2"]
        )
        print(f"httpx2 is {ratio:.1f}x faster per batch")


if __name__ == "__main__":
    main()
