"""How much CPU and wall time does agentrl's client cost per request, against the fastest raw client?

    python benchmarks/rollout_overhead.py [--rounds 5] [--requests 4000] [--concurrency 64]
                                          [--burst 2000] [--full] [--hold 2000]

1. Client (the headline). A minimal loopback server in its own process answers every
   ``POST /generate`` with one canned SGLang body (24 tokens with logprobs) and does nothing
   else, so what is timed is the client. Each client sends the same 256-token request:
   - ``raw aiohttp`` (the fastest raw client: one ``ClientSession`` set up as agentrl sets
     up its own, body ``json.dumps`` -> POST -> ``json.loads``), ``raw httpx2`` (the same
     with one ``httpx2.AsyncClient``);
   - ``agentrl`` (``InferenceClient.generate`` with a session id: routing, dialect, Completion)
     on its default transport, and ``agentrl/httpx2`` (``Config(transport="httpx2")``).
   All share one connection limit (512, ``InferenceClient.Config.max_connections``). Two
   measurements per client: *steady*, ``--requests`` requests from ``--concurrency`` workers,
   gives the client process's CPU time per request (``time.process_time``); *burst*,
   ``--burst`` requests sent at once, gives the wall time until the last one is back. Rounds
   alternate the clients' order; ratios are agentrl / raw aiohttp within a round.
2. ``--full``: the whole rollout path (RolloutCollector -> EnvAgentLoop -> ledger ->
   InferenceClient) on ``games/GuessNumber-v0`` against the embedded server with a tiny model,
   ``max_new_tokens=1``, in turns/s; then the same prompts replayed by raw aiohttp, in
   requests/s. Then ``--hold`` trajectories held in flight at once in one collector process:
   peak memory per trajectory (RSS growth over the idle baseline).

Goal: agentrl's CPU per request and its burst wall time each <= 1.5x raw aiohttp's. The last
line is JSON; its ratio is the larger (harder) of the two median ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx2
import psutil
import yarl

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.inference.wire import finish_reason_dict, generate_response
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, TrajectoryGroup

ENV = "games/GuessNumber-v0"
GOAL = 1.5
MAX_CONNECTIONS = InferenceClient.Config().max_connections
PROMPT = [(7 * i) % 5000 + 3 for i in range(256)]
SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=(2,))


# ---- 1. the client against a canned server --------------------------------------------------
def _canned_body() -> bytes:
    ids = list(range(100, 124))
    resp = generate_response(
        rid="canned",
        text="x" * 24,
        output_ids=ids,
        finish_reason=finish_reason_dict("length", length=24),
        prompt_tokens=len(PROMPT),
        weight_version=0,
        e2e_latency=0.001,
        output_logprobs=[-1.234567 - i / 100 for i in range(24)],
    )
    body = json.dumps(resp, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class _Canned(asyncio.Protocol):
    """HTTP/1.1 keep-alive: read a request head and its Content-Length body, write the answer."""

    answer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            at = head.find(b"content-length:")
            size = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + size:
                return
            self.buf = self.buf[end + 4 + size :]
            self.transport.write(self.answer)


def _serve_canned(port: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    _Canned.answer = _canned_body()

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            _Canned, "127.0.0.1", 0, backlog=4096
        )
        port.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


Send = Callable[[int], Awaitable[object]]


def _body() -> bytes:
    return json.dumps(
        {
            "input_ids": PROMPT,
            "sampling_params": {
                "max_new_tokens": 24,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "stop_token_ids": [2],
            },
            "return_logprob": True,
        },
        separators=(",", ":"),
    ).encode()


_HEADERS = {"content-type": "application/json"}


async def _measure(send: Send, args: argparse.Namespace) -> tuple[float, float, float]:
    """(steady CPU ms/request, burst wall s, burst CPU ms/request) for one client."""
    await asyncio.gather(*(send(i) for i in range(args.concurrency)))  # warm the pool
    left = iter(range(args.requests))

    async def worker() -> None:
        for i in left:
            await send(i)

    gc.collect()
    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    steady = (time.process_time() - cpu) * 1e3 / args.requests
    gc.collect()
    cpu, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(send(i) for i in range(args.burst)))
    wall = time.perf_counter() - t0
    return steady, wall, (time.process_time() - cpu) * 1e3 / args.burst


async def _client_round(
    url: str, name: str, args: argparse.Namespace
) -> tuple[float, float, float]:
    if name == "raw aiohttp":
        # Tuned as agentrl tunes it (url parsed once, no decompression, no User-Agent), so
        # the baseline is the fastest way to use the library, not its defaults.
        conn = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0)
        generate = yarl.URL(url + "/generate", encoded=True)
        async with aiohttp.ClientSession(
            connector=conn, auto_decompress=False, skip_auto_headers=("User-Agent",)
        ) as session:

            async def send_aiohttp(i: int) -> object:
                async with session.post(generate, data=_body(), headers=_HEADERS) as r:
                    if r.status != 200:
                        raise RuntimeError(r.status)
                    return json.loads(await r.read())

            return await _measure(send_aiohttp, args)
    if name == "raw httpx2":
        limits = httpx2.Limits(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
        )
        async with httpx2.AsyncClient(limits=limits, timeout=600, trust_env=False) as http:

            async def send_httpx2(i: int) -> object:
                r = await http.post(url + "/generate", content=_body(), headers=_HEADERS)
                r.raise_for_status()
                return json.loads(r.content)

            return await _measure(send_httpx2, args)
    # The raw clients' generous connect limit: a loaded machine can delay a burst's connects
    # past the client's default 5 s, which would count as a failed server.
    cfg = InferenceClient.Config(
        transport="httpx2" if name == "agentrl/httpx2" else "aiohttp", connect_timeout_s=600.0
    )
    async with InferenceClient([url], cfg) as client:

        async def send_agentrl(i: int) -> object:
            return await client.generate(PROMPT, SAMPLING, session_id=f"traj-{i}")

        return await _measure(send_agentrl, args)


CLIENTS = ["raw aiohttp", "agentrl", "raw httpx2", "agentrl/httpx2"]


def bench_client(args: argparse.Namespace) -> dict[str, list[tuple[float, float, float]]]:
    ctx = mp.get_context("spawn")
    port: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    server = ctx.Process(target=_serve_canned, args=(port,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port.get(timeout=60)}"
    out: dict[str, list[tuple[float, float, float]]] = {c: [] for c in CLIENTS}
    try:
        for r in range(args.rounds):
            order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
            for name in order:
                out[name].append(asyncio.run(_client_round(url, name, args)))
            row = "  ".join(f"{n} {out[n][-1][0]:.3f} ms, {out[n][-1][1]:.2f} s" for n in CLIENTS)
            print(f"round {r}: {row}", flush=True)
    finally:
        server.terminate()
        server.join()
    return out


def _spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def report_client(
    out: dict[str, list[tuple[float, float, float]]], args: argparse.Namespace
) -> dict[str, object]:
    print(f"\nclient vs a canned /generate server, {args.rounds} rounds; median (range)")
    print(
        f"{'client':<16}{'CPU ms/req (steady)':>26}{f'burst {args.burst} wall s':>24}"
        f"{'CPU ms/req (burst)':>26}"
    )
    for name, rows in out.items():
        cols = [[r[k] for r in rows] for k in range(3)]
        print(
            f"{name:<16}{_spread(cols[0], '.3f'):>26}{_spread(cols[1], '.2f'):>24}"
            f"{_spread(cols[2], '.3f'):>26}"
        )
    base, ours = out["raw aiohttp"], out["agentrl"]
    cpu_r = [o[0] / b[0] for o, b in zip(ours, base, strict=True)]
    wall_r = [o[1] / b[1] for o, b in zip(ours, base, strict=True)]
    print(
        f"agentrl / raw aiohttp: CPU per request {_spread(cpu_r, '.2f')}x, "
        f"burst wall {_spread(wall_r, '.2f')}x (goal <= {GOAL}x each)"
    )
    cpu_m, wall_m = statistics.median(cpu_r), statistics.median(wall_r)
    cpu_b, wall_b = statistics.median(r[0] for r in base), statistics.median(r[1] for r in base)
    cpu_o, wall_o = statistics.median(r[0] for r in ours), statistics.median(r[1] for r in ours)
    if cpu_m >= wall_m:
        what, b, o, ratio = "CPU ms per request", f"{cpu_b:.3f} ms", f"{cpu_o:.3f} ms", cpu_m
    else:
        what, b, o, ratio = (
            f"wall s for {args.burst} requests at once",
            f"{wall_b:.2f} s",
            f"{wall_o:.2f} s",
            wall_m,
        )
    return {
        "benchmark": f"rollout_overhead: client {what} (harder of CPU/request and "
        f"{args.burst}-burst wall; other {min(cpu_m, wall_m):.2f}x)",
        "baseline": f"raw aiohttp {b}",
        "ours": f"agentrl InferenceClient {o}",
        "ratio": round(ratio, 2),
        "goal": f"<= {GOAL}",
        "met": max(cpu_m, wall_m) <= GOAL,
    }


# ---- 2. the whole rollout path against the embedded server ----------------------------------
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
    """The same prompts as bare aiohttp POSTs at the same concurrency; requests/s."""
    queue = list(reversed(prompts))
    conn = aiohttp.TCPConnector(limit=concurrency * 2, limit_per_host=0)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            while queue:
                body = {
                    "input_ids": queue.pop(),
                    "return_logprob": True,
                    "sampling_params": {
                        "max_new_tokens": 1,
                        "temperature": 1.0,
                        "stop_token_ids": stop_ids,
                    },
                }
                async with session.post(
                    url + "/generate", data=json.dumps(body).encode(), headers=_HEADERS
                ) as r:
                    if r.status != 200:
                        raise RuntimeError(f"{r.status}: {await r.text()}")
                    json.loads(await r.read())

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


async def full_path(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    model = make_tiny_model(tmp / "model")
    template = ChatTemplate.from_pretrained(model)
    stop_ids = list(template.stop_token_ids)
    cfg = ServerProcess.Config(model=str(model), max_batch_size=args.concurrency, num_threads=1)
    with ServerProcess(cfg) as srv:
        warm = argparse.Namespace(**{**vars(args), "trajectories": 16})
        await run_agentrl(srv.url, template, warm)
        agentrl_rates, raw_rates = [], []
        for rep in range(args.reps):
            rate, turns, prompts = await run_agentrl(srv.url, template, args)
            agentrl_rates.append(rate)
            raw_rates.append(await run_raw(srv.url, prompts, args.concurrency, stop_ids))
            print(
                f"rep {rep}: agentrl {rate:8.1f} turns/s ({turns} turns) | "
                f"raw aiohttp {raw_rates[-1]:8.1f} req/s",
                flush=True,
            )
        ratios = [a / r for a, r in zip(agentrl_rates, raw_rates, strict=True)]
        print(
            f"full rollout path / raw aiohttp against the embedded server: "
            f"{_spread(ratios, '.2f')}x turns/s"
        )
        if args.hold:
            h = await hold(srv.url, template, args)
            print(
                f"\nholding {args.hold} concurrent {args.turns}-turn trajectories in one "
                "collector process:"
            )
            for k, v in h.items():
                print(f"  {k:<22}{v:>12.2f}")


def main(args: argparse.Namespace) -> None:
    out = bench_client(args)
    result = report_client(out, args)
    if args.full:
        print()
        asyncio.run(full_path(args))
    print(json.dumps(result))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="client rounds (each runs every client)")
    p.add_argument("--requests", type=int, default=4000, help="steady requests per client")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--burst", type=int, default=2000, help="requests sent at once")
    p.add_argument("--full", action="store_true", help="also time the whole rollout path")
    p.add_argument("--trajectories", type=int, default=256, help="--full: trajectories per rep")
    p.add_argument("--turns", type=int, default=4, help="--full: turns per trajectory")
    p.add_argument("--hold", type=int, default=2000, help="--full: trajectories held; 0 skips")
    p.add_argument("--reps", type=int, default=2, help="--full: repetitions")
    return p.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(parse_args(sys.argv[1:]))
