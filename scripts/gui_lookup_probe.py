"""How fast a tiny model learns the GUI click tasks' lookup: which element the instruction names.

    python scripts/gui_lookup_probe.py [--tasks open,press,choose,menu,tick] [--train 4096]
        [--eval 256] [--hidden 128] [--layers 2] [--lr 2e-3] [--batch 32] [--steps 1500]
        [--every 250] [--prompt-weight 0] [--ids before|after] [--quote] [--copy-steps 0]
        [--device cpu|cuda] [--threads 2] [--seed 0] [--data FILE] [--save-data FILE]

The click tasks (``envs/gui/click_tasks.py``) come down to one skill: find the element whose
name the instruction quotes and answer with its id. ``agentrl train recipes/gui_click*.yaml``
measures that through SFT, GRPO and sampled episodes, minutes per run; this probe measures
only the skill, fast enough to sweep: it records oracle demonstrations of the train split and
of the held-out (eval) split through ``gui/Browser-v0`` (drawn pages, no browser), builds the
tiny model's tokenizer from the train demonstrations' text (as ``model.tiny.corpus_demos``
does), and trains a fresh tiny model on the replies with a plain PyTorch loop (AdamW, linear
warm-up, cosine decay to a tenth). Every ``--every`` steps it prints one JSON line: the
training loss and the share of held-out conversations whose every reply token the model
predicts right (teacher-forced, greedy), overall and per task type; 1/6 is a random element
of six for ``open`` and ``press``.

Variants: ``--ids after`` writes ids after names in the tree (``link "small clock" [3]``);
``--quote`` makes each oracle reply quote its element before acting (``quote_target``);
``--prompt-weight W`` adds W x the cross-entropy of the observation tokens (as
``sft.prompt_loss_weight``); ``--copy-steps N`` first trains N steps on random strings
followed by themselves (loss on the repeat: a model that can copy in context, an induction
head, before the task). ``--save-data FILE`` keeps the token rows (gzip pickle) and ``--data
FILE`` reads them back, so a GPU host needs no env to run the sweep.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import pickle
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

DATA_SETTINGS = ("tasks", "train", "eval", "ids", "quote")
"""What the token rows depend on (kept with --save-data, restored by --data)."""
Row = tuple[str, list[int], list[int]]  # task type, token ids, loss mask (1 on reply tokens)


def demonstrations(
    tasks: list[str], n: int, split: str, kwargs: dict[str, Any], seed: int = 0
) -> list[Any]:
    """Oracle conversations of ``n`` tasks of ``split`` (content-disjoint, ``agentrl.splits``)."""
    import asyncio

    from trainers.config import DataConfig, EnvEntry
    from trainers.sft import _demonstration

    data = DataConfig(
        envs=[
            EnvEntry(
                id="gui/Browser-v0",
                kwargs={"task": tasks, "backend": "pillow", "screenshots": False, **kwargs},
            )
        ],
        eval_fraction=0.25,
        seed=seed * 1_000_003,  # as a run of that seed draws its train tasks
    )

    async def record() -> list[Any]:
        samples = [data.sample(i, eval=split == "eval") for i in range(n)]
        return list(await asyncio.gather(*(_demonstration(s) for s in samples)))

    return [c for c in asyncio.run(record()) if c is not None]


def task_type(conversation: Any) -> str:
    """The task type of a click-task conversation, from its instruction's first word."""
    first = conversation.messages[0].text.split("Task: ", 1)[1].split()[0]
    return {"Open": "open", "Press": "press", "Choose": "choose", "Go": "menu", "Tick": "tick"}.get(
        first, first
    )


def build_rows(args: argparse.Namespace, model_dir: Path) -> tuple[list[Row], list[Row]]:
    """Train and held-out rows, tokenized by a tokenizer learned from the train demos."""
    from agentrl.chat import ChatTemplate
    from agentrl.tiny import make_tiny_model
    from trainers.sft import conversation_segment

    tasks = args.tasks.split(",")
    kwargs = {"ids": args.ids, "quote_target": args.quote, "max_steps": 4}
    train = demonstrations(tasks, args.train, "train", kwargs, args.seed)
    held_out = demonstrations(tasks, args.eval, "eval", kwargs)
    corpus = ["\n".join(m.text for m in c.messages) for c in train]
    make_tiny_model(model_dir, hidden_size=32, num_layers=1, corpus=corpus)  # the tokenizer
    template = ChatTemplate.from_pretrained(model_dir)

    def rows(convs: list[Any]) -> list[Row]:
        out = []
        for c in convs:
            seg = conversation_segment(template, c)
            out.append((task_type(c), list(seg.token_ids), list(seg.loss_mask)))
        return out

    return rows(train), rows(held_out)


def copy_rows(n: int, vocab: int, rng: random.Random) -> list[Row]:
    """``n`` rows ``prefix x <sep> x`` (x: 8-24 random ordinary tokens), loss on the repeat."""
    out = []
    for _ in range(n):
        x = [rng.randrange(10, vocab) for _ in range(rng.randint(8, 24))]
        prefix = [rng.randrange(10, vocab) for _ in range(rng.randint(0, 8))]
        ids = [*prefix, *x, 5, *x]
        out.append(("copy", ids, [0] * (len(ids) - len(x)) + [1] * len(x)))
    return out


def tensors(rows: Sequence[Row], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(r[1]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (_, tok, m) in enumerate(rows):
        ids[i, : len(tok)] = torch.tensor(tok)
        mask[i, : len(tok)] = torch.tensor(m, dtype=torch.float)
        attn[i, : len(tok)] = 1
    return ids.to(device), mask.to(device), attn.to(device)


def loss_and_exact(
    model: Any, rows: Sequence[Row], device: str, prompt_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean reply-token cross-entropy (+ prompt_weight x the other tokens'), and per row
    whether every reply token is the model's greedy choice."""
    ids, mask, attn = tensors(rows, device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    target, m = ids[:, 1:], mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    loss = (nll * m).sum() / m.sum().clamp(min=1)
    if prompt_weight:
        other = attn[:, 1:].float() * (1 - m)
        loss = loss + prompt_weight * (nll * other).sum() / m.sum().clamp(min=1)
    wrong = ((logits.argmax(-1) != target).float() * m).sum(1)
    return loss, wrong == 0


def evaluate(model: Any, rows: Sequence[Row], device: str) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        exact = torch.cat(
            [loss_and_exact(model, rows[i : i + 64], device)[1] for i in range(0, len(rows), 64)]
        ).cpu()
    model.train()
    out = {"all": round(float(exact.float().mean()), 3)}
    for kind in sorted({r[0] for r in rows}):
        picked = [i for i, r in enumerate(rows) if r[0] == kind]
        out[kind] = round(float(exact[picked].float().mean()), 3)
    return out


def train(
    model: Any,
    rows: list[Row] | None,
    steps: int,
    args: argparse.Namespace,
    vocab: int,
    held_out: Sequence[Row] = (),
) -> float:
    """``steps`` AdamW steps on ``rows`` (None: copy rows), printing a JSON line on
    ``held_out`` every ``args.every`` steps; the last loss."""
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    loss = torch.tensor(0.0)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        warm = min(1.0, step / 50)
        lr = args.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = rng.sample(rows, args.batch) if rows else copy_rows(args.batch, vocab, rng)
        loss, _ = loss_and_exact(model, batch, args.device, args.prompt_weight if rows else 0.0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if held_out and (step % args.every == 0 or step == steps):
            line = {
                "step": step,
                "loss": round(float(loss.detach()), 4),
                "held_out_exact": evaluate(model, held_out, args.device),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(json.dumps(line), flush=True)
    return float(loss.detach())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", default="open,press,choose,menu,tick")
    p.add_argument("--train", type=int, default=4096, help="train-split demonstrations")
    p.add_argument("--eval", type=int, default=256, help="held-out demonstrations")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--prompt-weight", type=float, default=0.0)
    p.add_argument("--ids", choices=("before", "after"), default="before")
    p.add_argument("--quote", action="store_true", help="oracle replies quote their element")
    p.add_argument("--copy-steps", type=int, default=0, help="copy warm-up steps first")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="", help="token rows from --save-data (no env needed)")
    p.add_argument("--save-data", default="")
    args = p.parse_args()
    if args.steps < 1 or args.train < 1 or args.eval < 1 or args.batch < 1:
        p.error("--steps, --train, --eval and --batch must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="gui_lookup_probe_"))
    try:
        if args.data:
            with gzip.open(args.data, "rb") as f:
                rows, held_out, files, made_with = pickle.load(f)
            vars(args).update(made_with)  # the data's tasks, counts, ids and quote settings
            for name, blob in files.items():
                (work / name).write_bytes(blob)
        else:
            rows, held_out = build_rows(args, work)
            files = {q.name: q.read_bytes() for q in work.iterdir() if q.is_file()}
            if args.save_data:
                with gzip.open(args.save_data, "wb") as f:
                    made_with = {k: getattr(args, k) for k in DATA_SETTINGS}
                    pickle.dump((rows, held_out, files, made_with), f)
        config = AutoConfig.from_pretrained(work)
        config.update(
            {
                "hidden_size": args.hidden,
                "num_hidden_layers": args.layers,
                "intermediate_size": 4 * args.hidden,
                "num_attention_heads": args.heads,
                "num_key_value_heads": max(1, args.heads // 2),
                "head_dim": args.hidden // args.heads,
            }
        )
        if getattr(config, "layer_types", None):  # one entry per layer (full attention)
            config.layer_types = [config.layer_types[0]] * args.layers
        model = AutoModelForCausalLM.from_config(config).to(args.device)
        if args.copy_steps:
            copy_loss = train(model, None, args.copy_steps, args, config.vocab_size)
            print(json.dumps({"copy_steps": args.copy_steps, "copy_loss": round(copy_loss, 4)}))
        train(model, rows, args.steps, args, config.vocab_size, held_out)
        final = evaluate(model, held_out, args.device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("data", "save_data")}
    print(json.dumps({"probe": "gui_lookup", **settings, "held_out_exact": final}))


if __name__ == "__main__":
    main()
