"""scripts/copy_probe.py: its sequences hide the copy at a varying distance, its loss is on the copy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.script_module import SCRIPTS, load_script

SCRIPT = SCRIPTS / "copy_probe.py"


def test_labels_are_the_repeated_string_and_its_distance_varies() -> None:
    probe = load_script("copy_probe")
    ids, labels = probe.batch(64, 5, 20, torch.Generator().manual_seed(0))
    gaps = set()
    for row, lab in zip(ids.tolist(), labels.tolist(), strict=True):
        start = row.index(probe.OPEN) + 1
        string = row[start : start + 5]
        rep = row.index(probe.REPEAT)
        assert row[rep + 1 : rep + 6] == string
        assert [x for x in lab if x != -100] == string  # the loss sees the copy and nothing else
        assert all(probe.STRING_IDS[0] <= x < probe.STRING_IDS[1] for x in string)
        gaps.add(rep - start)
    assert len(gaps) > 5  # the copy is not at a fixed offset


def test_a_short_run_prints_its_figures_as_json_and_saves_a_usable_model(tmp_path: Path) -> None:
    args = "--hidden 32 --layers 1 --length 3 --filler 4 --steps 3 --every 2 --batch 4 --all-ids"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args.split(), "--save", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.splitlines()
    assert [x.split(":")[0] for x in out[:-1]] == ["step 2", "step 3"]
    last = json.loads(out[-1])
    assert last["probe"] == "copy" and last["step"] == 3 and 0.0 <= last["string_acc"] <= 1.0
    assert last["loss"] > 0
    from agentrl.chat import ChatTemplate

    template = ChatTemplate.from_pretrained(tmp_path / "m")  # what a recipe's model.path loads
    assert template.tokenizer.vocab_size > 100
    assert (tmp_path / "m" / "model.safetensors").exists()
