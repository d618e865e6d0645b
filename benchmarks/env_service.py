"""The env service under load: remote envs against in-process ones, in one run.

    python benchmarks/env_service.py [--generator embedded|scripted] [--sessions 256]
                                     [--samples 128] [--reps 3] [--gen-ms 50] [--servers 2]

``--servers`` env servers (``agentrl envs serve games/GuessNumber-v0 games/GridWorld-v0``),
each its own process on loopback. On a 2-core machine every server process takes CPU from
the client (the process that runs the collector, as the in-process baseline does alone), so
``--servers 1`` is reported too. Besides samples/s, the CPU each process spent per sample
(from ``/proc``) says where the time went. Three parts:

1. ``--sessions`` concurrent remote sessions spread over the servers (reset, 4 steps,
   close, all at once): errors, and the sessions left open on the servers afterwards
   (leaks; must be 0).
2. End-to-end rollouts: ``RolloutCollector`` over ``--samples`` GuessNumber/GridWorld samples,
   in-process envs (the baseline) and ``remote:`` envs, rounds alternating; samples/s and the
   ratio remote / in-process (goal >= 0.8). ``--generator embedded`` (the default) samples
   from agentrl's embedded inference server, in its own process, running the quickstart's
   tiny model (``--new-tokens`` per turn): a rollout as training runs it. ``--generator
   scripted`` replaces the model with ``ScriptedGenerator`` and ``--gen-ms`` of latency per
   call: the envs' share of the work is then far larger than in training, and ``--gen-ms 0``
   is the worst case, where the envs are all the work.
3. The per-step latency one remote step adds over an in-process one (p50, p99), from
   sequential steps of one env.

Ends with one JSON line: ``{"benchmark", "baseline", "ours", "ratio", "goal", "met"}``, after a
``details:`` line (errors, leaks, added latency, CPU per sample, load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.env import make_env  # noqa: E402
from agentrl.envserver.client import close_pools  # noqa: E402
from agentrl.inference.client import InferenceClient  # noqa: E402
from agentrl.inference.launch import ServerProcess  # noqa: E402
from agentrl.plugins import load_plugins  # noqa: E402
from agentrl.rollout.collector import CollectorConfig, RolloutCollector  # noqa: E402
from agentrl.rollout.testing import ScriptedGenerator  # noqa: E402
from agentrl.tiny import build_tokenizer, make_tiny_model  # noqa: E402
from agentrl.types import Message, Sample  # noqa: E402

ENVS = ("games/GuessNumber-v0", "games/GridWorld-v0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, max_sessions: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "agentrl.cli", "envs", "serve", *ENVS, "--port", str(port)]
    cmd += ["--max-sessions", str(max_sessions)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx2.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"env server on port {port} did not start")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has spent."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_sessions(urls: list[str]) -> int:
    return sum(len(httpx2.get(f"{u}/sessions").json()["sessions"]) for u in urls)


async def concurrent_sessions(urls: list[str], n: int) -> dict[str, float]:
    cap = {"max_sessions_per_server": -(-n // len(urls)) + 8}

    async def one(i: int) -> None:
        env = make_env(f"remote:{','.join(urls)}/{ENVS[i % 2]}", remote=cap)
        try:
            await env.areset(seed=i)
            for a in ("8", "up", "4", "right"):
                await env.astep(Message(role="assistant", content=a))
        finally:
            await env.aclose()

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    wall = time.perf_counter() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors[:3]:
        print(f"  error: {type(e).__name__}: {e}")
    return {"sessions": n, "errors": len(errors), "wall_s": wall}


def scripted(template: ChatTemplate, gen_ms: float) -> ScriptedGenerator:
    """Fixed replies after ``gen_ms`` of latency: no model."""

    async def respond(prompt: str, turn: int) -> str:
        if gen_ms:
            await asyncio.sleep(gen_ms / 1000)
        return ["8", "up", "4", "right", "12", "down"][turn % 6]

    return ScriptedGenerator(template, respond)


async def rollouts(
    prefix: str, n: int, generator: Any, template: ChatTemplate, new_tokens: int
) -> float:
    """Samples/s of ``n`` rollouts, all at once (remote: every session fits on one server)."""
    c = RolloutCollector(
        CollectorConfig(
            group_size=1,
            max_turns=4,
            agent="env_driver",
            max_concurrency=256,
            max_new_tokens=new_tokens,
            max_tokens=512,
        ),
        generator,
        template,
    )
    kw = {"remote": {"max_sessions_per_server": n}} if prefix else {}
    samples = [Sample(env_id=f"{prefix}{ENVS[i % 2]}", seed=i, env_kwargs=kw) for i in range(n)]
    t0 = time.perf_counter()
    groups = await c.collect(iter(samples))
    dt = time.perf_counter() - t0
    bad = [t for g in groups for t in g.trajectories if t.status.is_infra_failure]
    if bad:
        raise RuntimeError(f"{len(bad)} rollouts failed, e.g. {bad[0].error}")
    return n / dt


async def step_latency(prefix: str, steps: int) -> list[float]:
    env = make_env(f"{prefix}games/GuessNumber-v0", max_turns=steps + 1)
    out = []
    await env.areset(seed=0)
    for _ in range(steps):
        t0 = time.perf_counter()
        await env.astep(Message(role="assistant", content="hmm"))
        out.append(time.perf_counter() - t0)
    await env.aclose()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    load_plugins()
    if args.generator == "embedded":
        model = make_tiny_model(
            Path(tempfile.mkdtemp(prefix="agentrl-bench-envs-")) / "model",
            arch="qwen2",
            hidden_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
        )
        template = ChatTemplate.from_pretrained(model)
        with ServerProcess(ServerProcess.Config(model=str(model), max_batch_size=256)) as server:
            client = InferenceClient([server.url])
            try:
                what = f"embedded server, tiny qwen2 (hidden 128, 2 layers), {args.new_tokens} tokens a reply"
                return await measure(args, template, client, what)
            finally:
                await client.aclose()
    template = ChatTemplate(build_tokenizer())
    what = f"scripted, {args.gen_ms:g} ms per generate"
    return await measure(args, template, scripted(template, args.gen_ms), what)


async def measure(
    args: argparse.Namespace, template: ChatTemplate, generator: Any, what: str
) -> dict[str, object]:
    ports = [free_port() for _ in range(args.servers)]
    procs = [start_server(p, args.sessions) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    load0 = os.getloadavg()
    try:
        print(f"load average {load0[0]:.1f}; servers {', '.join(urls)}")
        conc = await concurrent_sessions(urls, args.sessions)
        leaked = open_sessions(urls)
        print(
            f"{conc['sessions']} concurrent remote sessions on {len(urls)} servers: "
            f"{conc['errors']} errors, {leaked} left open, {conc['wall_s']:.2f} s"
        )
        remote_prefix = f"remote:{','.join(urls)}/"
        warm = (generator, template, args.new_tokens)
        await rollouts("", min(16, args.samples), *warm)  # warm-up
        await rollouts(remote_prefix, min(16, args.samples), *warm)
        local_rates, remote_rates = [], []
        cpu = {"in_process": 0.0, "remote_client": 0.0, "remote_servers": 0.0}
        for rep in range(args.reps):
            c0 = time.process_time()
            local_rates.append(await rollouts("", args.samples, *warm))
            c1, s1 = time.process_time(), sum(cpu_s(p.pid) for p in procs)
            remote_rates.append(await rollouts(remote_prefix, args.samples, *warm))
            c2, s2 = time.process_time(), sum(cpu_s(p.pid) for p in procs)
            cpu["in_process"] += c1 - c0
            cpu["remote_client"] += c2 - c1
            cpu["remote_servers"] += s2 - s1
            print(
                f"rep {rep}: in-process {local_rates[-1]:7.1f} samples/s | "
                f"remote {remote_rates[-1]:7.1f} samples/s ({what})"
            )
        cpu_ms = {k: round(1000 * v / (args.reps * args.samples), 2) for k, v in cpu.items()}
        print(f"CPU ms per sample: {cpu_ms}")
        left = open_sessions(urls)
        print(f"sessions left open after the rollouts: {left}")
        leaked += left
        local = await step_latency("", args.latency_steps)
        remote = await step_latency(f"remote:{urls[0]}/", args.latency_steps)
        added_p50 = (pct(remote, 0.5) - pct(local, 0.5)) * 1000
        added_p99 = (pct(remote, 0.99) - pct(local, 0.99)) * 1000
        print(f"added per-step latency: p50 {added_p50:.2f} ms, p99 {added_p99:.2f} ms")
        base, ours = statistics.median(local_rates), statistics.median(remote_rates)
        ratio = ours / base
        details = {
            "generator": what,
            "concurrent_sessions": conc["sessions"],
            "session_errors": conc["errors"],
            "leaked_sessions": leaked,
            "added_step_ms_p50": round(added_p50, 3),
            "added_step_ms_p99": round(added_p99, 3),
            "cpu_ms_per_sample": cpu_ms,
            "load_avg_1m": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
            "cores": os.cpu_count(),
        }
        print(f"details: {json.dumps(details)}")
        return {
            "benchmark": (
                f"env_service rollout samples/s, remote ({len(urls)} env servers) / in-process"
                f" ({what})"
            ),
            "baseline": round(base, 2),
            "ours": round(ours, 2),
            "ratio": round(ratio, 3),
            "goal": 0.8,
            "met": bool(ratio >= 0.8 and conc["errors"] == 0 and leaked == 0),
        }
    finally:
        await close_pools()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=256, help="concurrent remote sessions")
    p.add_argument("--samples", type=int, default=128, help="rollouts per round")
    p.add_argument("--reps", type=int, default=3, help="rounds, alternating")
    p.add_argument(
        "--generator",
        choices=("embedded", "scripted"),
        default="embedded",
        help="embedded: the tiny quickstart model on agentrl's embedded server (as in training); "
        "scripted: fixed replies after --gen-ms",
    )
    p.add_argument("--new-tokens", type=int, default=16, help="tokens per reply (embedded)")
    p.add_argument("--gen-ms", type=float, default=50.0, help="scripted: latency per turn")
    p.add_argument("--servers", type=int, default=2, help="env server processes")
    p.add_argument("--latency-steps", type=int, default=400, help="sequential steps timed")
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
