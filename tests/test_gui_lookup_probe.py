"""scripts/gui_lookup_probe.py: its rows are the click tasks' demonstrations, the loss on the
replies only, held-out rows from the eval split; a short run prints its figures as JSON and
its saved rows run again without an env."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from agentrl.splits import split_of
from tests.script_module import SCRIPTS, load_script

SCRIPT = SCRIPTS / "gui_lookup_probe.py"


def test_held_out_demonstrations_come_from_the_eval_split_and_quote_their_element() -> None:
    probe = load_script("gui_lookup_probe")
    kwargs = {"ids": "after", "quote_target": True, "max_steps": 4}
    held_out = probe.demonstrations(["open", "press", "tick"], 12, "eval", kwargs)
    train = probe.demonstrations(["open", "press", "tick"], 12, "train", kwargs)
    for convs, split in ((held_out, "eval"), (train, "train")):
        assert len(convs) == 12
        for c in convs:
            instruction = c.messages[0].text.split("Task: ", 1)[1].splitlines()[0]
            assert split_of(f"{probe.task_type(c)}: {instruction}", 0.25) == split
            reply = c.messages[1].text.splitlines()
            assert len(reply) == 2 and reply[0].endswith("]") and reply[1].startswith("click(")


def test_rows_put_the_loss_on_the_replies_only(tmp_path: Path) -> None:
    probe = load_script("gui_lookup_probe")
    args = argparse.Namespace(tasks="open,menu", train=6, eval=4, ids="before", quote=False, seed=0)
    rows, held_out = probe.build_rows(args, tmp_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(rows) == 6 and len(held_out) == 4
    for kind, ids, mask in rows:
        assert kind in ("open", "menu") and len(ids) == len(mask)
        replies = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert replies.count("click(") == (1 if kind == "open" else 2)
        assert "Task:" not in replies and "Page:" not in replies


def test_a_short_run_prints_json_and_its_saved_rows_run_again(tmp_path: Path) -> None:
    data = tmp_path / "rows.pkl.gz"
    common = [
        "--tasks",
        "open,press",
        "--steps",
        "3",
        "--every",
        "2",
        "--batch",
        "4",
        "--hidden",
        "32",
        "--threads",
        "1",
    ]

    def run(*args: str) -> list[dict]:
        out = subprocess.run(
            [sys.executable, str(SCRIPT), *common, *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()
        return [json.loads(line) for line in out if line.startswith("{")]

    first = run(
        "--train",
        "16",
        "--eval",
        "8",
        "--ids",
        "after",
        "--copy-steps",
        "2",
        "--save-data",
        str(data),
    )
    assert first[0]["copy_steps"] == 2
    assert [line["step"] for line in first[1:-1]] == [2, 3]
    final = first[-1]
    assert final["probe"] == "gui_lookup" and final["ids"] == "after"
    assert set(final["held_out_exact"]) == {"all", "open", "press"}
    assert all(0.0 <= v <= 1.0 for v in final["held_out_exact"].values())
    again = run("--data", str(data), "--eval", "1")  # the data's settings win over the flags
    assert (again[-1]["eval"], again[-1]["train"], again[-1]["ids"]) == (8, 16, "after")
