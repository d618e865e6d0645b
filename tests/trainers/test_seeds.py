"""`--seeds`: parsing, the reproducing command, and mean +/- standard error over seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentrl.errors import AgentRLError
from trainers.cli import _command, _parse_seeds
from trainers.eval import standard_error, summarize_seeds


def test_seeds_parse_and_bad_input_says_the_form() -> None:
    assert _parse_seeds("0,1, 2") == [0, 1, 2]
    assert _parse_seeds(None) is None
    with pytest.raises(AgentRLError, match="--seeds 0,1,2"):
        _parse_seeds("0,x")
    with pytest.raises(AgentRLError, match="distinct"):
        _parse_seeds("1,1")


def test_the_command_reruns_as_written() -> None:
    cmd = _command("train", "recipes/q.yaml", ["name=a b"], ["--seeds", "0,1,2"])
    assert cmd == "agentrl train recipes/q.yaml 'name=a b' --seeds 0,1,2"


def test_summary_over_seeds_is_the_mean_and_standard_error_of_the_runs(tmp_path: Path) -> None:
    def run(seed: int, before: float, after: float) -> dict[str, object]:
        ev = {"n": 128.0, "num_tasks": 16.0, "reward_mean": after}
        return {
            "seed": seed,
            "run_dir": f"r{seed}",
            "steps": 40,
            "wall_time_s": 1.0,
            "eval_before": {**ev, "success_rate": before},
            "eval_after": {**ev, "success_rate": after},
        }

    runs = [run(0, 0.7, 0.9), run(1, 0.0, 0.1), run(2, 0.2, 0.5)]
    s = summarize_seeds(runs, tmp_path / "q-seeds", command="agentrl train q --seeds 0,1,2")
    after = s["eval_after"]["success_rate"]
    assert after["mean"] == pytest.approx(0.5)
    # sample standard deviation over seeds / sqrt(3): sqrt(((.4)^2 + (.4)^2 + 0) / 2) / sqrt(3)
    assert after["se"] == pytest.approx(math.sqrt(0.16) / math.sqrt(3))
    assert s["seeds"] == [0, 1, 2] and s["eval_before"]["n_per_seed"] == 128.0
    assert json.loads((tmp_path / "q-seeds" / "summary.json").read_text()) == s
    assert standard_error([1.0]) == 0.0
