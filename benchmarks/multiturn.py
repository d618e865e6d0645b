"""Multi-turn generation: the embedded server with its prefix pool against the same server without.

    python benchmarks/multiturn.py                                   # one H200: 337M Llama, bf16
    python benchmarks/multiturn.py --device cpu --layers 2 --hidden 64 --heads 4 \
        --conversations 16 --turns 4                                 # CPU

An agent's turn k + 1 sends the whole conversation again: turn k's prompt and answer, then
the tool's output. ``--conversations`` conversations run at once, each ``--turns`` turns over
HTTP (``InferenceClient``, one /generate per turn): a seeded system-and-task prompt of
``--prompt`` tokens, ``--answer`` new tokens a turn (EOS ignored, temperature 1), then
``--tool`` tokens of tool output. The same conversations run against two servers, one after
the other, each after a warm-up run of the same shapes:

    pool      ``--engine static`` as shipped: a finished turn's KV stays in a free slot and
              the next turn copies it (``agentrl/inference/prefix_pool.py``)
    no-pool   the same with ``--no-prefix-pool``: every turn prefills the whole conversation

It prints each server's wall time, its prefill time (``prefill_s`` of /get_server_info) and
pool hit rate, and ends with one JSON line: the pool's speed-up of the whole run (wall time
of no-pool / pool), goal >= 1.0 (never slower; the gain grows with the conversation's length).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL = 1.0


def conversation_tokens(
    args: argparse.Namespace, vocab: int
) -> list[tuple[list[int], list[list[int]]]]:
    """Per conversation: its first prompt and the tool outputs of its turns (seeded)."""
    rng = random.Random(args.seed)
    return [
        (
            [rng.randrange(5, vocab) for _ in range(args.prompt)],
            [[rng.randrange(5, vocab) for _ in range(args.tool)] for _ in range(args.turns)],
        )
        for _ in range(args.conversations)
    ]


async def _run(url: str, convs: list[tuple[list[int], list[list[int]]]], answer: int) -> float:
    from agentrl.inference.client import InferenceClient
    from agentrl.inference.protocol import SamplingParams

    async with InferenceClient([url]) as client:

        async def one(i: int, prompt: list[int], tools: list[list[int]]) -> None:
            ids = list(prompt)
            for turn, tool in enumerate(tools):
                sp = SamplingParams(
                    max_new_tokens=answer, temperature=1.0, ignore_eos=True, seed=1000 * i + turn
                )
                out = await client.generate(ids, sp)
                if len(out.output_ids) != answer:
                    raise RuntimeError(
                        f"conversation {i} turn {turn}: {len(out.output_ids)} tokens"
                    )
                ids += [*out.output_ids, *tool]

        start = time.perf_counter()
        await asyncio.gather(*(one(i, p, t) for i, (p, t) in enumerate(convs)))
        return time.perf_counter() - start


def run_server(name: str, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    import httpx2

    from agentrl.inference.launch import ServerProcess

    extra = ["--device", args.device, "--engine", "static", "--max-seq-len", str(args.max_seq_len)]
    if name == "no-pool":
        extra.append("--no-prefix-pool")
    cfg = ServerProcess.Config(
        model=args.model,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        num_threads=args.num_threads,
        log_path=str(Path(args.out) / f"server-{name}.log"),
        startup_timeout_s=600,
        extra_args=extra,
    )
    with ServerProcess(cfg) as server:
        warm = argparse.Namespace(**{**vars(args), "seed": args.seed + 1})
        asyncio.run(_run(server.url, conversation_tokens(warm, vocab), args.answer))
        before = httpx2.get(server.url + "/get_server_info", timeout=30).json()["engine"]
        wall = asyncio.run(_run(server.url, conversation_tokens(args, vocab), args.answer))
        after = httpx2.get(server.url + "/get_server_info", timeout=30).json()["engine"]
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    pooled = after["pool_hit_tokens"] - before["pool_hit_tokens"]
    out = {
        "wall_s": round(wall, 3),
        "prefill_s": round(after["prefill_s"] - before["prefill_s"], 3),
        "pool_hit_rate": round(pooled / max(prompt, 1), 3),
        "prompt_tokens": prompt,
        "pool_evicted": after["pool_evicted"],
    }
    print(f"{name}: {json.dumps(out)}", flush=True)
    return out


def main() -> None:
    from generation import add_model_args, ensure_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_model_args(p)
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--prompt", type=int, default=256, help="first prompt's tokens")
    p.add_argument("--answer", type=int, default=48, help="new tokens a turn")
    p.add_argument("--tool", type=int, default=96, help="tool output tokens a turn")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--max-batch-size", type=int, default=128, help="slots: room for parking")
    p.add_argument("--num-threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="/tmp/agentrl_gen_bench_model")
    p.add_argument("--out", default="/tmp/agentrl_multiturn_bench", help="server logs")
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    need = args.prompt + args.turns * (args.answer + args.tool)
    if need > args.max_seq_len:
        p.error(f"a conversation reaches {need} tokens: raise --max-seq-len to at least that")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    from transformers import AutoConfig

    ensure_model(args)
    vocab = int(AutoConfig.from_pretrained(args.model).vocab_size)
    shape = (
        f"{args.conversations} conversations x {args.turns} turns "
        f"(prompt {args.prompt}, answer {args.answer}, tool {args.tool} tokens)"
    )
    print(shape, flush=True)
    no_pool = run_server("no-pool", args, vocab)
    pool = run_server("pool", args, vocab)
    ratio = round(no_pool["wall_s"] / pool["wall_s"], 3)
    line = {
        "benchmark": f"multi-turn generation wall time, {shape}",
        "baseline": f"the same server with --no-prefix-pool: {no_pool['wall_s']} s",
        "ours": pool["wall_s"],
        "ratio": ratio,
        "goal": GOAL,
        "met": ratio >= GOAL,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
