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


def test_seeds_train_at_once_in_processes_of_their_own(tmp_path: Path) -> None:
    """`--seeds 0,1 --jobs 2`: two real runs (subprocesses, each its own Ray and server) at once,
    their CPUs shared, each run's output logged, the mean over both."""
    from tests.trainers.test_driver import RECIPE, SMOKE
    from trainers.cli import train_seeds_main

    overrides = [
        *SMOKE,
        "train.steps=1",
        "checkpoint.every=0",
        f"output_dir={tmp_path}",
        "name=par",
    ]
    s = train_seeds_main(RECIPE, [0, 1], overrides, jobs=2)
    assert s["seeds"] == [0, 1]
    assert s["command"].endswith("--seeds 0,1 --jobs 2")
    assert [r["run_dir"] for r in s["runs"]] == [str(tmp_path / "par-s0"), str(tmp_path / "par-s1")]
    assert s["eval_after"] is not None and s["eval_after"]["n_per_seed"] == 2
    for seed in (0, 1):
        run = json.loads((tmp_path / f"par-s{seed}" / "summary.json").read_text())
        assert run["seed"] == seed and run["steps"] == 1
        assert "train.num_cpus=" in run["command"]  # the machine's CPUs split between the two
        assert f"seed={seed}" in (tmp_path / "par-seeds" / f"seed{seed}.log").read_text()
    assert json.loads((tmp_path / "par-seeds" / "summary.json").read_text()) == s


def test_failed_seed_runs_are_named_with_their_logs(tmp_path: Path) -> None:
    from trainers.seed_jobs import run_seed_jobs

    missing = str(tmp_path / "no-such-recipe.yaml")
    argv = {3: [missing, "seed=3"], 4: [missing, "seed=4"]}
    dirs = {3: tmp_path / "r3", 4: tmp_path / "r4"}
    with pytest.raises(AgentRLError) as e:
        run_seed_jobs(argv, dirs, jobs=2, log_dir=tmp_path / "logs")
    text = str(e.value)
    assert "2 of 2 seed runs failed" in text
    assert "seed 3: exit code 2" in text and "seed 4: exit code 2" in text
    assert "no-such-recipe.yaml" in (tmp_path / "logs" / "seed3.log").read_text()


def test_jobs_without_seeds_or_below_one_is_refused() -> None:
    from tests.trainers.test_driver import RECIPE
    from trainers.cli import train_cmd, train_seeds_main

    with pytest.raises(AgentRLError, match="needs --seeds"):
        train_cmd(RECIPE, [], jobs=2)
    with pytest.raises(AgentRLError, match="--jobs must be >= 1"):
        train_seeds_main(RECIPE, [0, 1], [], jobs=0)
