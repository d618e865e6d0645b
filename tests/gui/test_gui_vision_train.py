"""``agentrl train recipes/gui_vision.yaml``, shrunk: a tiny Qwen2-VL-style model trained on
real Chromium screenshots through the real driver (Ray, embedded server over HTTP, torch
engine). SFT on the oracle's demonstrations with their screenshots, then GRPO; the first PPO
step is on-policy with images in every prompt (ppo_kl = 0 in fp32), and after a step the
server holds the trainer's weights, vision tower included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.inference.weights import checksum_named_tensors
from tests.gui.shrunk import SHRUNK
from trainers.config import load_run_config
from trainers.driver import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "gui_vision.yaml"


@pytest.fixture(scope="module")
def ray_local():  # type: ignore[no-untyped-def]
    import ray

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")
def test_a_vision_model_trains_on_screenshots_on_policy(tmp_path: Path, ray_local: None) -> None:
    cfg = load_run_config(RECIPE, [*SHRUNK, f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        first = trainer.step()
        assert first["train/num_loss_tokens"] > 0
        assert first["train/rollout_logprob_diff"] <= 1e-4
        assert abs(first["train/ppo_kl_first"]) <= 1e-6
        trainer.step()
        assert trainer.fleet is not None and trainer.fleet.client is not None
        sums = trainer.fleet.run(trainer.fleet.client.weights_checksum())
        local = checksum_named_tensors(trainer.actor.named_weights().items(), dtype=torch.float32)
        assert any(".visual." in n for n in local.tensors)
        for remote in sums.values():
            assert remote.weight_version == 2
            assert all(remote.tensors[n] == c for n, c in local.tensors.items())
    finally:
        trainer.close()
    # The screenshots were in the prompts: every logged segment counts its images (the line
    # keeps them once, in the messages).
    files = sorted((cfg.run_dir / "trajectories").glob("step_*.jsonl"))
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert lines
    for line in lines:
        assert all(s.get("num_images", 0) >= 1 and "images" not in s for s in line["segments"])
