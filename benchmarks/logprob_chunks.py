"""The torch engine's PPO update and logprob pass with the vocabulary projection chunked at the
old fixed 1,024 tokens against the chunk chosen by device (``engine.logprob_chunk_tokens: 0``,
``trainers.engines.torch_model.projection_chunk``).

    python benchmarks/logprob_chunks.py [--device cuda] [--groups 16] [--group-size 8]
                                        [--chunks 1024,0,16384] [--repeats 5]

A tiny model (``agentrl.tiny``, 2 layers, hidden 128, its ~1,030-token vocabulary) and a batch
of multi-turn rows with random tokens (a 110-token prompt, then 1-8 turns of 24 generated and
20 observed tokens). For each chunk size, a fresh engine runs three warm-up rounds, then
``--repeats`` rounds of the update (two epochs of two mini-batches, entropy on) and of
``compute_logprobs``; each line gives the mean seconds of each. Ends with one JSON line
``{benchmark, baseline, ours, ratio, goal, met}``: the update at 1,024 over the update at the
device's own chunk (goal: 1.5x on a GPU, where each chunk is a dozen kernel launches; on CPU
the chunk chosen is 1,024 itself, so the goal there is no change, ratio >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

import torch

from agentrl.batch import TrainBatch
from agentrl.engine import EngineConfig
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup
from trainers.engines.torch_native import TorchEngine
from trainers.updates import PolicyLoss, PolicyUpdate, run_epochs


def make_batch(groups: int, group_size: int, seed: int = 0) -> TrainBatch:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, 800) for _ in range(110)]
        trajs = []
        for _ in range(group_size):
            s = Segment()
            s.extend_prompt(prompt)
            for _ in range(rng.randint(1, 8)):
                gen = [rng.randrange(10, 800) for _ in range(24)]
                s.extend_generated(gen, [-1.0] * len(gen), 0)
                s.extend_prompt([rng.randrange(10, 800) for _ in range(20)])
            trajs.append(Trajectory(sample=Sample(env_id="x"), segments=[s], reward=rng.random()))
        out.append(TrajectoryGroup(uid=f"g{g}", trajectories=trajs))
    batch = TrainBatch.from_groups(out, pad_token_id=0)
    batch["old_logprobs"] = torch.full(batch.loss_mask.shape, -1.0)
    batch["advantages"] = torch.randn(len(batch), 1)
    return batch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_chunk(model: str, batch: TrainBatch, chunk: int, device: str, repeats: int) -> dict:
    dtype = "bfloat16" if device == "cuda" else "float32"
    cfg = EngineConfig(
        model_path=model,
        device=device,
        dtype=dtype,
        micro_batch_size=128,
        logprob_chunk_tokens=chunk,
    )
    engine = TorchEngine(cfg)
    engine.initialize()
    loss = PolicyLoss(PolicyUpdate(epochs=2, num_mini_batches=2))

    def update() -> None:
        run_epochs(engine, batch, loss, epochs=2, num_mini_batches=2, with_entropy=True)

    for _ in range(3):
        update()
        engine.compute_logprobs(batch)
    sync(device)
    timings = {}
    for name, fn in (("update_s", update), ("logprob_s", lambda: engine.compute_logprobs(batch))):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync(device)
        timings[name] = round((time.perf_counter() - t0) / repeats, 4)
    return {"chunk": chunk, "chunk_used": engine.scorer.chunk_tokens, **timings}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--chunks", default="1024,0", help="comma-separated; 0: chosen by device")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    model = str(make_tiny_model(tempfile.mkdtemp() + "/m", hidden_size=128, num_layers=2))
    batch = make_batch(args.groups, args.group_size)
    tokens = int(batch.attention_mask.sum())
    print(f"batch {len(batch)} x {batch.seq_len}, {tokens} real tokens, {args.device}", flush=True)
    rows = {}
    for chunk in [int(c) for c in args.chunks.split(",")]:
        rows[chunk] = time_chunk(model, batch, chunk, args.device, args.repeats)
        print("timing", json.dumps(rows[chunk]), flush=True)
    base, ours = rows.get(1024), rows.get(0)
    if base is None or ours is None:
        return
    ratio = round(base["update_s"] / max(ours["update_s"], 1e-9), 3)
    goal = 1.5 if args.device == "cuda" else 0.9
    headline = {
        "benchmark": f"logprob_chunks ({args.device}, update, {tokens} tokens)",
        "baseline": f"chunk 1024: {base['update_s']} s",
        "ours": f"chunk by device ({ours['chunk_used']}): {ours['update_s']} s",
        "ratio": ratio,
        "goal": goal,
        "met": ratio >= goal,
    }
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
