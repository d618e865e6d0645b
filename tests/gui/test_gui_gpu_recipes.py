"""``recipes/gui_gpu.yaml``, ``recipes/gui_click_gpu.yaml`` and ``recipes/gui_vision_gpu.yaml``, shrunk to CPU: the GPU recipes'
path (pages drawn with ``backend: pillow``, no browser) through the real driver (Ray, the
embedded server over HTTP, the torch engine). SFT on the oracle's demonstrations, then GRPO
steps that are on-policy (ppo_kl = 0 in fp32), text mode and vision mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gui.shrunk import SHRUNK
from trainers.config import load_run_config
from trainers.driver import Trainer

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
CPU = [  # the GPU recipes on this machine, with the shrunk model of tests/gui/shrunk.py
    "engine.device=cpu",
    "engine.dtype=float32",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "engine.micro_batch_size=4",
    "inference.max_batch_size=8",
    "model.tiny.corpus_demos=8",
    *SHRUNK,
]


@pytest.fixture(scope="module")
def ray_local():  # type: ignore[no-untyped-def]
    import ray

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        "gui_gpu.yaml",
        "gui_click_gpu.yaml",
        # the CPU click recipe: the same path as gui_click_gpu.yaml with other sizes; CI's slow
        # step leaves it to `pytest -m recipe` for time
        pytest.param("gui_click.yaml", marks=pytest.mark.recipe),
        # CI's slow step skips it for time (~35 s): recipes/gui_vision.yaml's browser test
        # trains the same vision path on CPU; `pytest -m recipe` runs it.
        pytest.param("gui_vision_gpu.yaml", marks=pytest.mark.recipe),
    ],
)
def test_the_gpu_recipes_train_on_drawn_pages_on_policy(
    recipe: str, tmp_path: Path, ray_local: None
) -> None:
    cfg = load_run_config(RECIPES / recipe, [*CPU, f"output_dir={tmp_path}"])
    assert cfg.engine.device == "cpu" and cfg.data.envs[0].kwargs["backend"] == "pillow"
    vision = cfg.model.tiny is not None and cfg.model.tiny.arch == "qwen2_vl"
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        first = trainer.step()
        assert first["train/num_loss_tokens"] > 0
        assert abs(first["train/ppo_kl_first"]) <= 1e-6
    finally:
        trainer.close()
    files = sorted((cfg.run_dir / "trajectories").glob("step_*.jsonl"))
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert lines and all("Page:" in json.dumps(line["messages"]) for line in lines)
    images = [s.get("num_images", 0) for line in lines for s in line["segments"]]
    assert all(n >= 1 for n in images) if vision else not any(images)
