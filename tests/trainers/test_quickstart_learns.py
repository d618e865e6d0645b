"""The quickstart's learning claim, checked the way the docs state it (slow: ~7 min on 2 cores).

`agentrl train recipes/quickstart.yaml --seeds 0,1 --jobs 2`, through the same entry point as the
CLI (both seeds at once, each in a process of its own on one of the 2 cores):
for every seed, success on the eval split (tasks disjoint by content from every SFT and RL task)
must rise by at least two standard errors of the difference, on at least 128 distinct eval
tasks. A recipe that learns on one seed only, or an eval that overlaps training, fails here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainers.cli import train_seeds_main

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
# the docs' figure uses seeds 0, 1, 2; CI checks two of them (the standard's minimum), for time
SEEDS = [0, 1]
JOBS = 2  # both seeds at once, each on half the cores (train.num_cpus): see .ci/run


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(3600)  # two full runs at once: ~7 min on 2 free cores, more on a busy machine
def test_quickstart_rises_by_two_standard_errors_on_every_seed(tmp_path: Path) -> None:
    overrides = [f"output_dir={tmp_path}", "logging.console=false", "checkpoint.every=0"]
    summary = train_seeds_main(RECIPE, SEEDS, overrides, jobs=JOBS)

    saved = json.loads((tmp_path / "quickstart-seeds" / "summary.json").read_text())
    assert saved["seeds"] == SEEDS
    assert "--seeds 0,1" in saved["command"]
    rises = {}
    for run in summary["runs"]:
        before, after = run["eval_before"], run["eval_after"]
        assert before["n"] == after["n"] == 256
        assert after["num_tasks"] >= 128, f"seed {run['seed']}: {after['num_tasks']} eval tasks"
        se = math.hypot(before["success_se"], after["success_se"])
        assert se > 0, f"seed {run['seed']}: no spread in {before} -> {after}"
        rises[run["seed"]] = (after["success_rate"] - before["success_rate"]) / se
    assert min(rises.values()) >= 2.0, f"rise in standard errors per seed: {rises}"
