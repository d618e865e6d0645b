"""recipes/swe.yaml and recipes/swe_gpu.yaml load, validate and describe one curriculum.

The default suite checks the configs (no sandbox, no prepared repositories); the ``slow`` test
trains the CPU recipe, shrunk, end to end for two RL steps on prepared repositories.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from agentrl.splits import split_of
from envs.swe.env import SWEEnv
from trainers.config import load_run_config

ROOT = Path(__file__).parents[2]
RECIPES = ("recipes/swe.yaml", "recipes/swe_gpu.yaml")


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_swe_recipes_validate_and_their_curriculum_is_split_by_repository(
    recipe: str,
) -> None:
    cfg = load_run_config(ROOT / recipe)
    cfg.validate()
    assert cfg.rollout.agent == "swe" and cfg.sft.steps > 0 and cfg.train.steps > 0
    [entry] = cfg.data.envs
    assert entry.id == "swe/Repo-v0"
    kwargs = {**entry.kwargs, "tasks": str(ROOT / entry.kwargs["tasks"])}
    env = SWEEnv(**kwargs)  # filters and prompt options are checked here; no sandbox yet
    by_split = Counter(split_of(t.repo, cfg.data.eval_fraction) for t in env.tasks)
    assert by_split["train"] >= 40 and by_split["eval"] >= 15
    assert env.tools is not None and "submit" in env.tools.names
    assert cfg.rollout.max_tokens <= 1024  # a short context for a small model


def test_the_gpu_recipe_is_the_cpu_curriculum_at_larger_scale() -> None:
    cpu, gpu = (load_run_config(ROOT / r) for r in RECIPES)
    assert gpu.data.envs[0].kwargs == cpu.data.envs[0].kwargs
    assert (gpu.engine.device, gpu.engine.dtype) == ("cuda", "bfloat16")
    assert gpu.model.tiny.hidden_size > cpu.model.tiny.hidden_size
    assert gpu.train.batch_size * gpu.train.steps > cpu.train.batch_size * cpu.train.steps
    assert gpu.sft.steps * gpu.sft.batch_size > cpu.sft.steps * cpu.sft.batch_size
    script = (ROOT / "recipes/swe_gpu.sh").read_text()
    assert "command -v" in script and "bwrap git" in script
    assert subprocess.run(["bash", "-n", str(ROOT / "recipes/swe_gpu.sh")]).returncode == 0


@pytest.mark.slow
@pytest.mark.recipe  # ~2-3 min; .ci/run leaves it out (45-minute budget)
def test_the_swe_recipe_trains_end_to_end_for_two_rl_steps(tmp_path: Path) -> None:
    """Prepare (reused when done), SFT on oracle demonstrations, eval, 2 GRPO steps, eval."""
    if shutil.which("bwrap") is None:
        pytest.skip("the local sandbox backend needs bubblewrap")
    repos = os.environ.get("AGENTRL_SWE_REPOS", "/var/tmp/agentrl-swe")
    agentrl = [sys.executable, "-c", "from agentrl.cli import main; main()"]
    tasks = ["--tasks", "data/swe/tasks.jsonl", "--tasks", "data/swe/negate.jsonl"]
    prep = [*agentrl, "swe", "prepare", "--out", repos, *tasks]
    subprocess.run(prep, cwd=ROOT, check=True, capture_output=True)
    recipe = yaml.safe_load((ROOT / "recipes/swe.yaml").read_text())
    recipe["data"]["envs"][0]["kwargs"]["repos_dir"] = repos  # lists take no dotted override
    (tmp_path / "swe.yaml").write_text(yaml.safe_dump(recipe))
    overrides = [
        f"output_dir={tmp_path}",
        "name=swe-shrunk",
        "sft.steps=4",
        "sft.num_demos=8",
        "train.steps=2",
        "train.batch_size=2",
        "train.mini_batch_size=1",
        "rollout.group_size=4",
        "eval.num_samples=4",
        "checkpoint.every=0",
    ]
    run = subprocess.run(
        [*agentrl, "train", str(tmp_path / "swe.yaml"), *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "swe-shrunk" / "metrics.jsonl").open()]
    assert sum("timing/step_s" in r for r in rows) == 2
    assert any(k.startswith("eval/") for r in rows for k in r)
