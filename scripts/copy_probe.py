"""How fast a tiny model from agentrl.tiny learns to copy: the skill the SWE, GUI and long-tail
curricula fail at (a path, a password, a tool's value written back later).

    python scripts/copy_probe.py [--hidden 128] [--layers 2] [--length 8] [--filler 100]
                                 [--steps 2500] [--lr 1e-3] [--batch 32] [--seed 0]
                                 [--all-ids] [--save DIR]

Each sequence is ``filler_a <5> x_1..x_L filler_b <6> x_1..x_L``: L tokens drawn from 64 ids,
random filler (0..--filler tokens each, ids disjoint from the string's) around them, so the
copy sits at a different distance every time and a model must find the string by its marker,
not by position. The loss is on the repeated string only (chance: ln 64 = 4.16; with
``--all-ids``, ln of the vocabulary's size). With ``--filler 0`` the copy is always L+1
tokens back (the easy, positional case). Every ``--every`` steps it prints the training loss
and, on a fresh batch, the share of copied tokens and of whole strings the model predicts
right (greedy, teacher-forced); the last line is JSON with the final figures. ``--save DIR``
writes the trained model as a base for a recipe (``model.path=DIR``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from agentrl.tiny import make_tiny_model

STRING_IDS = (100, 164)  # the 64 ids strings are drawn from
FILLER_IDS = (300, 400)  # ids of the filler, never in a string
OPEN, REPEAT = 5, 6  # the markers before the string and before its copy


def batch(
    n: int,
    length: int,
    filler: int,
    gen: torch.Generator,
    strings: tuple[int, int] = STRING_IDS,
    fillers: tuple[int, int] = FILLER_IDS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` padded sequences and their labels (-100 everywhere but the copy); string and
    filler tokens are drawn from the id ranges ``strings`` and ``fillers``."""
    width = 2 * filler + 2 * length + 2
    ids = torch.zeros(n, width, dtype=torch.long)
    labels = torch.full((n, width), -100)
    for i in range(n):
        x = torch.randint(*strings, (length,), generator=gen)
        a, b = (int(torch.randint(0, filler + 1, (1,), generator=gen)) for _ in range(2))
        parts = [
            torch.randint(*fillers, (a,), generator=gen),
            torch.tensor([OPEN]),
            x,
            torch.randint(*fillers, (b,), generator=gen),
            torch.tensor([REPEAT]),
            x,
        ]
        seq = torch.cat(parts)
        ids[i, : len(seq)] = seq
        labels[i, len(seq) - length : len(seq)] = x
    return ids, labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--length", type=int, default=8, help="tokens in the string to copy")
    p.add_argument("--filler", type=int, default=100, help="most filler tokens on each side")
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--all-ids",
        action="store_true",
        help="strings and filler both from every ordinary token id (not 64 ids and a disjoint "
        "filler range): the copy as it meets real text",
    )
    p.add_argument("--save", default="", help="write the trained model here (an HF directory)")
    args = p.parse_args()
    if args.length < 1 or args.filler < 0 or args.steps < 1:
        p.error("--length >= 1, --filler >= 0 and --steps >= 1 are needed")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    base = Path(tempfile.mkdtemp(prefix="copy_probe_"))
    try:
        path = make_tiny_model(
            base,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=max(1, args.heads // 2),
            seed=args.seed,
        )
        model = AutoModelForCausalLM.from_pretrained(path)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        ranges = (STRING_IDS, FILLER_IDS)
        if args.all_ids:  # every id of the BPE vocabulary past the markers, no special token
            every = (REPEAT + 1, tokenizer.vocab_size)  # specials come first, added tokens after
            ranges = (every, every)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        # the loss of a uniform guess at a string token
        chance = math.log(ranges[0][1] - ranges[0][0])
        t0 = time.perf_counter()
        result: dict[str, float] = {}
        for step in range(1, args.steps + 1):
            ids, labels = batch(args.batch, args.length, args.filler, gen, *ranges)
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % args.every == 0 or step == args.steps:
                ids, labels = batch(args.batch, args.length, args.filler, gen, *ranges)
                with torch.no_grad():
                    pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
                target, mask = labels[:, 1:], labels[:, 1:] != -100
                right = (pred == target) | ~mask
                result = {
                    "step": step,
                    "loss": round(float(loss), 4),
                    "token_acc": round(float(right[mask].float().mean()), 4),
                    "string_acc": round(float(right.all(-1).float().mean()), 4),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                print(
                    f"step {step}: loss {result['loss']:.3f} (chance {chance:.2f}), "
                    f"tokens copied {result['token_acc']:.1%}, strings {result['string_acc']:.1%}, "
                    f"{result['seconds']:.0f} s",
                    flush=True,
                )
        if args.save:  # a base model for a recipe (model.path=DIR): the tiny model's files, trained
            shutil.copytree(base, args.save, dirs_exist_ok=True)
            model.save_pretrained(args.save)
    finally:  # the temporary model goes, whatever happens in training
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"probe": "copy", **vars(args), **result}))


if __name__ == "__main__":
    main()
