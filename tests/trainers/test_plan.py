"""The placement plan (``trainers/plan.py``, ``agentrl train --plan``) of the 8-GPU scale recipes.

Nothing is started: the plan is what a run on an 8-GPU host would do (issue 27); these checks
run on any machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from trainers.config import load_run_config
from trainers.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
DISAGG = ROOT / "recipes" / "scale_disaggregated.yaml"
COLOC = ROOT / "recipes" / "scale_colocated.yaml"


def test_disaggregated_plan_keeps_training_and_serving_gpus_apart() -> None:
    plan = make_plan(load_run_config(DISAGG), gpus=8)
    assert [r.gpu for r in plan.ranks] == [0, 1, 2, 3]
    assert plan.servers == [4, 5, 6, 7] and not plan.colocated
    assert plan.ray_gpus == 4  # Ray hands out GPUs 0-3 only
    assert plan.layout == {"tp": 2, "pp": 2, "cp": 1, "dp": 1}
    # Megatron's default order: tensor-parallel fastest, then context, data, pipeline
    assert [(r.coords["tp"], r.coords["pp"]) for r in plan.ranks] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    ]
    assert plan.weight_sync == "distributed" and "NCCL" in plan.sync_transport
    text = plan.render()
    assert "disaggregated, 8 of 8 GPUs used" in text and "NCCL_NVLS_ENABLE=0" in text


def test_colocated_plan_shares_every_gpu() -> None:
    plan = make_plan(load_run_config(COLOC), gpus=8)
    assert plan.colocated and plan.ray_gpus is None
    assert [r.gpu for r in plan.ranks] == list(range(8)) and plan.servers == list(range(8))
    assert plan.layout == {"tp": 2, "pp": 2, "cp": 1, "dp": 2}
    assert plan.ranks[5].coords == {"tp": 1, "cp": 0, "dp": 0, "pp": 1}
    assert plan.ranks[6].coords == {"tp": 0, "cp": 0, "dp": 1, "pp": 1}


@pytest.mark.parametrize(
    ("overrides", "gpus", "match"),
    [
        ([], 4, r"4 ranks need 4 GPUs|server 0 is placed on cuda:4 but the host has 4"),
        (["train.world_size=8"], 4, "need 8 GPUs"),
        (["inference.placement=[cuda:9]"], 8, "cuda:9 but the host has 8 GPUs"),
        (["inference.placement=[cuda:0, cuda:5]"], 8, "some servers share training GPUs"),
        ([], 0, "pass --gpus N"),
        (["inference.placement=[tpu:0]"], 8, "cpu, cuda or cuda:N"),
    ],
)
def test_plans_that_cannot_work_are_config_errors(
    overrides: list[str], gpus: int, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        make_plan(load_run_config(DISAGG, overrides), gpus=gpus)


def test_the_scale_model_has_about_a_billion_parameters() -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    t = load_run_config(DISAGG).model.tiny
    cfg = LlamaConfig(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_kv_heads,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        n = AutoModelForCausalLM.from_config(cfg).num_parameters()
    assert 0.9e9 < n < 1.1e9


def test_the_cli_prints_the_plan_without_starting_anything(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(DISAGG), "--plan", "--gpus", "8",
         f"output_dir={tmp_path}"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert "server 3: cuda:7" in out and "rank 3: cuda:3" in out
    assert not any(tmp_path.iterdir())  # no run directory, no model, no process
