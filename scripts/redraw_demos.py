"""Write a recipe's SFT demonstrations to a JSONL file, with copies whose file paths and line
numbers are redrawn at random: a probe of whether a model trained from scratch copies a path
out of an observation once recalling the training repositories' paths no longer pays.

    python scripts/redraw_demos.py RECIPE OUT.jsonl [--num 512] [--copies 3] [--seed 0]
    agentrl train RECIPE sft.dataset=OUT.jsonl ...

Every path ending in ``.py`` and every line number (``path.py:N`` in a listing, ``'Ns/`` in a
``sed`` command) is replaced consistently within a conversation, so a listing and the command
that uses it still agree. Paths are built from standard-library module names; the original
demonstrations are kept next to their copies. Written for ``recipes/swe.yaml``
(docs/guides/swe.md has what it measured).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_PATH = re.compile(r"[A-Za-z_][\w./-]*\.py")
_WORDS = sorted(n for n in sys.stdlib_module_names if n.isidentifier() and not n.startswith("_"))


def _strings(x: Any) -> Iterator[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)


def _map_strings(x: Any, f: Any) -> Any:
    if isinstance(x, str):
        return f(x)
    if isinstance(x, list):
        return [_map_strings(v, f) for v in x]
    if isinstance(x, dict):
        return {k: _map_strings(v, f) for k, v in x.items()}
    return x


def redraw(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """``messages`` (OpenAI format) with every ``.py`` path and line number redrawn."""
    text = "\n".join(_strings(messages))
    paths = sorted(set(_PATH.findall(text)), key=len, reverse=True)
    nums = sorted(set(re.findall(r"\.py:(\d+)", text)), key=len, reverse=True)
    if not paths:
        return messages

    def new_path() -> str:
        parts = [rng.choice(_WORDS) for _ in range(rng.randint(1, 3))]
        return "/".join((["src"] if rng.random() < 0.3 else []) + parts) + ".py"

    table = {p: new_path() for p in paths} | {n: str(rng.randint(1, 3000)) for n in nums}
    alternatives = [re.escape(p) for p in paths]
    if nums:
        either = "|".join(nums)
        alternatives += [rf"(?<=\.py:)(?:{either})\b", rf"(?<=')(?:{either})(?=s/)"]
    pattern = re.compile("|".join(alternatives))
    return _map_strings(messages, lambda s: pattern.sub(lambda m: table[m.group(0)], s))  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("out")
    p.add_argument("--num", type=int, default=512, help="demonstrations to record")
    p.add_argument("--copies", type=int, default=3, help="redrawn copies of each")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from trainers.config import load_run_config
    from trainers.sft import demonstrations

    rng = random.Random(args.seed)
    rows = []
    for conv in demonstrations(load_run_config(args.recipe, []).data, args.num):
        messages = [m.to_openai() for m in conv.messages]
        rows.append({"messages": messages, "tools": conv.tools})
        rows += [
            {"messages": redraw(messages, rng), "tools": conv.tools} for _ in range(args.copies)
        ]
    rng.shuffle(rows)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(
        f"{len(rows)} conversations ({args.copies} redrawn copies of each demonstration) -> {args.out}"
    )


if __name__ == "__main__":
    main()
