"""How much does agentrl's rollout path cost on top of raw HTTP requests to the same server?

    python benchmarks/rollout_overhead.py [--trajectories 256] [--concurrency 64] [--turns 4]
                                          [--hold 2000] [--reps 2]

1. Starts the embedded server (a separate process on loopback) with a tiny model.
2. agentrl: N concurrent multi-turn trajectories of ``games/GuessNumber-v0`` through the full
   path (RolloutCollector -> EnvAgentLoop -> RolloutContext/ledger -> InferenceClient -> HTTP),
   ``max_new_tokens=1``; every turn is one /generate request. Reports turns/s.
3. raw: replays exactly the same prompts (token ids recorded from step 2's ledgers) with bare
   ``httpx2`` POSTs at the same concurrency. Reports requests/s. Same server, same prompts, same
   concurrency: the ratio is agentrl's client-side overhead. Runs alternate to cancel drift.
4. Holds ``--hold`` multi-turn trajectories in flight at once in one collector process and
   reports the peak memory per trajectory (RSS growth over the idle baseline).

Target: agentrl turns/s >= 0.8x raw requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2
import psutil

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, TrajectoryGroup

ENV = "games/GuessNumber-v0"


def _collector(
    template: ChatTemplate, client: object, args: argparse.Namespace, conc: int
) -> RolloutCollector:
    cfg = CollectorConfig(
        group_size=1,
        max_concurrency=conc,
        max_turns=args.turns,
        max_new_tokens=1,
        agent="env_driver",
        tool_parser=None,
        temperature=1.0,
    )
    return RolloutCollector(cfg, client, template)  # type: ignore[arg-type]


def _samples(n: int) -> list[Sample]:
    # max_turns on the env is large so the collector's turn limit ends every rollout.
    return [
        Sample(env_id=ENV, env_kwargs={"high": 1000, "max_turns": 1000}, seed=i) for i in range(n)
    ]


async def run_agentrl(
    url: str, template: ChatTemplate, args: argparse.Namespace
) -> tuple[float, int, list[list[int]]]:
    async with InferenceClient([url]) as client:
        collector = _collector(template, client, args, args.concurrency)
        t0 = time.perf_counter()
        groups = await collector.collect(_samples(args.trajectories))
        dt = time.perf_counter() - t0
    prompts: list[list[int]] = []
    for g in groups:
        for t in g.trajectories:
            seg = t.segments[0]
            pos = 0
            for (
                turn
            ) in t.turns:  # the prompt of turn k is the ledger up to its first generated token
                start = seg.loss_mask.index(1, pos)
                prompts.append(seg.token_ids[:start])
                pos = start + len(turn.completion_ids)
    turns = sum(len(t.turns) for g in groups for t in g.trajectories)
    return turns / dt, turns, prompts


async def run_raw(
    url: str, prompts: list[list[int]], concurrency: int, stop_ids: list[int]
) -> float:
    limits = httpx2.Limits(
        max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2
    )
    queue = list(reversed(prompts))
    async with httpx2.AsyncClient(limits=limits, timeout=600.0) as http:

        async def worker() -> None:
            while queue:
                ids = queue.pop()
                body = {
                    "input_ids": ids,
                    "sampling_params": {
                        "max_new_tokens": 1,
                        "temperature": 1.0,
                        "stop_token_ids": stop_ids,
                    },
                    "return_logprob": True,
                }
                r = await http.post(url + "/generate", json=body)
                r.raise_for_status()
                r.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(prompts) / (time.perf_counter() - t0)


class _Gate:
    """Wraps a generator: every request waits until all ``n`` trajectories are in flight."""

    def __init__(self, inner: InferenceClient, n: int) -> None:
        self.inner, self.n = inner, n
        self.waiting = 0
        self.peak_inflight = 0
        self.released = asyncio.Event()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        if not self.released.is_set():
            self.waiting += 1
            self.peak_inflight = max(self.peak_inflight, self.waiting)
            if self.waiting >= self.n:
                self.released.set()
            await self.released.wait()
        return await self.inner.generate(input_ids, sampling, session_id=session_id)


async def hold(url: str, template: ChatTemplate, args: argparse.Namespace) -> dict[str, float]:
    proc = psutil.Process()
    base_rss = proc.memory_info().rss
    peak = [base_rss]
    done = threading.Event()

    def sample_rss() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    async with InferenceClient([url]) as client:
        gate = _Gate(client, args.hold)
        collector = _collector(template, gate, args, args.hold)
        t0 = time.perf_counter()
        groups: list[TrajectoryGroup] = await collector.collect(_samples(args.hold))
        dt = time.perf_counter() - t0
    done.set()
    sampler.join()
    ok = sum(1 for g in groups for t in g.trajectories if t.turns and not t.status.is_infra_failure)
    return {
        "trajectories": float(len(groups)),
        "finished_ok": float(ok),
        "peak_in_flight": float(gate.peak_inflight),
        "peak_rss_growth_mb": (peak[0] - base_rss) / 2**20,
        "kb_per_trajectory": (peak[0] - base_rss) / 1024 / max(1, args.hold),
        "wall_s": dt,
    }


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    model = make_tiny_model(tmp / "model")
    template = ChatTemplate.from_pretrained(model)
    stop_ids = list(template.stop_token_ids)
    cfg = ServerProcess.Config(model=str(model), max_batch_size=args.concurrency, num_threads=1)
    with ServerProcess(cfg) as srv:
        await run_agentrl(
            srv.url, template, argparse.Namespace(**{**vars(args), "trajectories": 16})
        )  # warm up
        agentrl_rates, raw_rates = [], []
        for rep in range(args.reps):
            rate, turns, prompts = await run_agentrl(srv.url, template, args)
            agentrl_rates.append(rate)
            raw_rates.append(await run_raw(srv.url, prompts, args.concurrency, stop_ids))
            print(
                f"rep {rep}: agentrl {rate:8.1f} turns/s ({turns} turns) | raw httpx2 {raw_rates[-1]:8.1f} req/s",
                flush=True,
            )
        a, r = statistics.median(agentrl_rates), statistics.median(raw_rates)
        print()
        print(f"{'path':<28}{'rate (/s)':>12}")
        print(f"{'raw httpx2 /generate':<28}{r:>12.1f}")
        print(f"{'agentrl full rollout path':<28}{a:>12.1f}")
        print(f"ratio agentrl/raw: {a / r:.2f}x  (target >= 0.80x)")
        if args.hold:
            h = await hold(srv.url, template, args)
            print()
            print(
                f"holding {args.hold} concurrent {args.turns}-turn trajectories in one collector process:"
            )
            for k, v in h.items():
                print(f"  {k:<22}{v:>12.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trajectories", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--hold", type=int, default=2000, help="0 skips the memory part")
    p.add_argument("--reps", type=int, default=2)
    return p.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(main(parse_args(sys.argv[1:])))
