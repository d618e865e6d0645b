"""What does recording cost? Chat requests through the gateway against the server's own route.

    python benchmarks/gateway.py [--rounds 5] [--agents 16] [--turns 8] [--max-tokens 16]

One embedded server (a tiny model, ``agentrl.tiny``) in its own process. ``--agents`` agents
run at once, each a ``--turns``-turn conversation written with the ``openai`` client (the
same code, messages, greedy sampling and ``max_tokens`` tokens per turn, EOS ignored, on both
sides):

- baseline: straight to the server's ``/v1/chat/completions`` (it renders the template and
  samples; nothing is recorded);
- ours: to a per-trajectory gateway ``base_url`` (``agentrl.gateway``): each request is
  matched against the conversation, rendered as a ledger delta, sent as token ids through
  ``InferenceClient`` to the same server's ``/generate``, parsed, answered and logged, so the
  trajectory's segments, masks, logprobs and versions are recorded.

Rounds alternate the two; the figures are requests/s and per-turn latency p50. Goal: the
gateway's requests/s >= 0.9x the server's own route. The last line is JSON.

``--cpu`` measures the gateway's hot path alone instead, in CPU time (which other jobs on the
machine do not change): the same conversations from raw aiohttp clients against a scripted
model in this process (no server, no baseline), CPU ms per request of the whole process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from agentrl.agent import Limits
from agentrl.chat import ChatTemplate
from agentrl.gateway import Gateway, GatewayContext
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample

GOAL = 0.9


PROMPT_TOKENS: dict[str, list[int]] = {}


async def agent(
    base_url: str, key: str, turns: int, max_tokens: int, lat: list[float], side: str = ""
) -> int:
    """A fixed conversation: ask, append the reply, ask again."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as oa:
        messages: list[Any] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Count from one to ten, then explain what you did."},
        ]
        for k in range(turns):
            t0 = time.perf_counter()
            r = await oa.chat.completions.create(
                model="m",
                messages=messages,
                max_tokens=max_tokens,
                temperature=0.0,
                seed=k,
                extra_body={"ignore_eos": True},  # every turn samples max_tokens on both sides
            )
            assert r.usage is not None and r.usage.completion_tokens == max_tokens
            PROMPT_TOKENS.setdefault(side, []).append(r.usage.prompt_tokens)
            lat.append(time.perf_counter() - t0)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": f"Now do it again, step {k}."})
    return turns


async def baseline(url: str, args: argparse.Namespace) -> tuple[float, list[float]]:
    lat: list[float] = []
    t0 = time.perf_counter()
    done = await asyncio.gather(
        *(
            agent(url + "/v1", "none", args.turns, args.max_tokens, lat, "server")
            for _ in range(args.agents)
        )
    )
    return sum(done) / (time.perf_counter() - t0), lat


async def through_gateway(
    client: InferenceClient, template: ChatTemplate, args: argparse.Namespace
) -> tuple[float, list[float]]:
    gw = await Gateway.shared()
    lat: list[float] = []
    sessions = []
    for i in range(args.agents):
        ctx = GatewayContext(
            sample=Sample(env_id="bench/none", uid=f"s{i}"),
            generator=client,
            template=template,
            sampling=SamplingParams(
                max_new_tokens=args.max_tokens, stop_token_ids=template.stop_token_ids
            ),
            limits=Limits(max_turns=args.turns + 1, max_tokens=4096, max_new_tokens=64),
            session_id=f"s{i}",
        )
        sessions.append(gw.open(ctx, honor_sampling=True))
    t0 = time.perf_counter()
    done = await asyncio.gather(
        *(agent(s.base_url, s.key, args.turns, args.max_tokens, lat, "gateway") for s in sessions)
    )
    rate = sum(done) / (time.perf_counter() - t0)
    for s in sessions:
        assert s.ctx.ledger.segments and s.requests == args.turns
        gw.close(s)
    return rate, lat


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-gw-"))
    model = make_tiny_model(tmp / "model")
    template = ChatTemplate.from_pretrained(model)
    cfg = ServerProcess.Config(model=str(model), max_batch_size=args.agents, num_threads=1)
    with ServerProcess(cfg) as srv:
        async with InferenceClient([srv.url]) as client:
            await baseline(srv.url, argparse.Namespace(**{**vars(args), "agents": 2}))
            await through_gateway(
                client, template, argparse.Namespace(**{**vars(args), "agents": 2})
            )
            base_rates, our_rates, base_lat, our_lat = [], [], [], []
            for rnd in range(args.rounds):
                order = ("base", "ours") if rnd % 2 == 0 else ("ours", "base")
                for side in order:
                    if side == "base":
                        rate, lat = await baseline(srv.url, args)
                        base_rates.append(rate)
                        base_lat += lat
                    else:
                        rate, lat = await through_gateway(client, template, args)
                        our_rates.append(rate)
                        our_lat += lat
                print(
                    f"round {rnd}: server /v1/chat/completions {base_rates[-1]:7.1f} req/s | "
                    f"gateway {our_rates[-1]:7.1f} req/s",
                    flush=True,
                )
    b, o = statistics.median(base_rates), statistics.median(our_rates)
    bl, ol = statistics.median(base_lat) * 1e3, statistics.median(our_lat) * 1e3
    ratios = sorted(o_ / b_ for o_, b_ in zip(our_rates, base_rates, strict=True))
    print(f"gateway / server requests/s per round: {ratios[0]:.2f}-{ratios[-1]:.2f}x")
    print(f"per-turn latency p50: server {bl:.1f} ms | gateway {ol:.1f} ms")
    pt = {k: statistics.mean(v) for k, v in PROMPT_TOKENS.items()}
    print(f"prompt tokens per request: server {pt['server']:.0f} | gateway {pt['gateway']:.0f}")
    ratio = o / b
    return {
        "benchmark": "gateway_requests_per_s",
        "baseline": round(b, 2),
        "ours": round(o, 2),
        "ratio": round(ratio, 3),
        "goal": GOAL,
        "met": ratio >= GOAL,
    }


async def cpu_per_request(args: argparse.Namespace) -> dict[str, Any]:
    """CPU ms per request of this process: gateway, raw aiohttp clients, a scripted model."""
    import aiohttp

    from agentrl.rollout.testing import ScriptedGenerator
    from agentrl.tiny import build_tokenizer

    template = ChatTemplate(build_tokenizer())
    gen = ScriptedGenerator(template, ["one two three four five six seven eight nine ten"])
    gw = await Gateway.shared()

    async def one(http: aiohttp.ClientSession, base_url: str, key: str) -> None:
        messages: list[Any] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Count from one to ten, then explain what you did."},
        ]
        for k in range(args.turns):
            body = {"model": "m", "messages": messages, "max_tokens": args.max_tokens}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(base_url + "/chat/completions", json=body, headers=headers) as r:
                answer = await r.json()
            messages.append(answer["choices"][0]["message"])
            messages.append({"role": "user", "content": f"Now do it again, step {k}."})

    per_round = []
    async with aiohttp.ClientSession() as http:
        for rnd in range(args.rounds):
            sessions = [
                gw.open(
                    GatewayContext(
                        sample=Sample(env_id="bench/none", uid=f"{rnd}-{i}"),
                        generator=gen,
                        template=template,
                        limits=Limits(max_turns=args.turns + 1, max_tokens=4096),
                        session_id=f"{rnd}-{i}",
                    )
                )
                for i in range(args.agents)
            ]
            c0 = time.process_time()
            await asyncio.gather(*(one(http, s.base_url, s.key) for s in sessions))
            ms = (time.process_time() - c0) / (args.agents * args.turns) * 1e3
            per_round.append(ms)
            print(f"round {rnd}: {ms:.2f} ms of CPU per request", flush=True)
            for s in sessions:
                gw.close(s)
    return {
        "benchmark": "gateway_cpu_ms_per_request",
        "ms": round(min(per_round[1:] or per_round), 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--cpu", action="store_true", help="the gateway's CPU per request alone")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse_args()
    print(json.dumps(asyncio.run(cpu_per_request(a) if a.cpu else main(a))))
