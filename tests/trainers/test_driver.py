"""The RL driver end to end: real Ray workers, a real embedded server over HTTP, a tiny model.

One run of the quickstart recipe, shrunk (SFT warm-up, 2 RL steps), is checked for what must
hold on every run: the trainer recomputes exactly the logprobs the server sampled with, the
first PPO step is on-policy (ppo_kl 0), every required metric is logged, the server ends up
holding the trainer's weights under the new version, and resuming from the step-1 checkpoint
reproduces step 2 exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agentrl.inference.weights import checksum_named_tensors
from agentrl.logging import REQUIRED_KEYS, read_jsonl
from trainers.config import RunConfig, load_run_config
from trainers.driver import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"

# The quickstart recipe, small enough for the default test run (~1 minute on 2 CPU cores).
SMOKE = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "sft.steps=3",
    "sft.num_demos=8",
    "sft.batch_size=4",
    "train.steps=2",
    "train.batch_size=2",
    "train.mini_batch_size=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "rollout.max_turns=2",
    "eval.num_samples=2",
    "checkpoint.every=1",
    "checkpoint.keep_last=2",
    "logging.console=false",
]

# Keys that differ between two runs of the same step for reasons that are not the model's.
_NOISY = (
    "timing/",
    "rollout/llm_time",
    "rollout/env_time",
    "rollout/wall_time",
    "throughput/gen_tokens_per_s",
    "throughput/train_tokens_per_s",
    "throughput/samples_per_s",
    "driver/generate_cpu_s",
    "inference/engine_",
    "inference/prefill_forwards",  # how requests were batched depends on when they came
    "inference/decode_steps",
)


def deterministic(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if not k.startswith(_NOISY)}


def smoke_config(tmp_path: Path, *extra: str) -> RunConfig:
    return load_run_config(RECIPE, [*SMOKE, f"output_dir={tmp_path}", *extra])


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=2)
    yield
    ray.shutdown()


def test_quickstart_smoke_parity_weights_and_exact_resume(tmp_path: Path, ray_local: None) -> None:
    cfg = smoke_config(tmp_path)
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        assert trainer.evaluate("before")["eval/num_trajectories"] == 2
        first = trainer.step()
        # The trainer's forward pass gives the server's sampling logprobs, and the first
        # mini-batch of the first epoch is exactly on-policy.
        assert first["train/num_loss_tokens"] > 0
        assert first["train/rollout_logprob_diff"] <= 1e-4
        assert abs(first["train/ppo_kl_first"]) <= 1e-6
        # Where the generate phase went: the server's engine counters of this step alone
        # (the eval before it is not counted), and the driver's own CPU in it.
        gen_s = first["timing/generate_s"]
        assert first["inference/prefill_forwards"] >= 1 and first["inference/decode_steps"] >= 1
        assert 0 < first["inference/engine_busy_s"] <= gen_s + 0.05
        assert first["inference/engine_prefill_s"] + first["inference/engine_decode_s"] > 0
        assert 0 < first["driver/generate_cpu_s"] <= gen_s + 0.05
        second = trainer.step()
        # The server holds the trainer's weights, tagged with the new version.
        assert trainer.fleet is not None and trainer.fleet.client is not None
        sums = trainer.fleet.run(trainer.fleet.client.weights_checksum())
        local = checksum_named_tensors(trainer.actor.named_weights().items(), dtype=torch.float32)
        for remote in sums.values():
            assert remote.weight_version == 2
            assert all(remote.tensors[n] == c for n, c in local.tensors.items())
        summary = trainer.finish({}, trainer.evaluate("after"), wall_s=0.0)
    finally:
        trainer.close()

    rows = read_jsonl(cfg.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert not set(REQUIRED_KEYS) - set(row)
    assert [r["train/weight_version"] for r in rows] == [1.0, 2.0]
    assert Path(summary["reward_curve"]).is_file()
    assert (cfg.run_dir / "hf" / "config.json").is_file()
    assert (cfg.run_dir / "sft_model" / "agentrl_sft.json").is_file()
    # What `agentrl view` shows, written by default: both groups of each step, with advantages
    # and the trainer's logprobs (equal to the server's on the sampled tokens).
    for step in (1, 2):
        logged = (cfg.run_dir / "trajectories" / f"step_{step:06d}.jsonl").read_text()
        records = [json.loads(line) for line in logged.splitlines()]
        assert [r["group_index"] for r in records] == [0, 0, 1, 1]
        for r in records:
            seg, lps = r["segments"][0], r["trainer_logprobs"][0]
            assert isinstance(r["advantages"][0], float)
            gen = [
                (a, b) for a, b, m in zip(lps, seg["logprobs"], seg["loss_mask"], strict=True) if m
            ]
            assert gen and all(abs(a - b) <= 1e-3 for a, b in gen)

    # Resume from the step-1 checkpoint: step 2 must be the same step 2.
    shutil.rmtree(cfg.run_dir / "checkpoints" / "step_000002")
    resumed = Trainer(smoke_config(tmp_path, "eval.num_samples=0"), resume=True)
    try:
        resumed.setup()
        assert (resumed.step_done, resumed.version, resumed.cursor) == (1, 1, 2)
        again = resumed.step()
    finally:
        resumed.close()
    # Same tokens, same update; server logprobs may move ~1e-7 with the batch composition.
    assert deterministic(again) == pytest.approx(deterministic(second), rel=1e-5, abs=1e-6)


def test_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    from agentrl.errors import ConfigError

    cfg = smoke_config(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="--resume"):
        Trainer(cfg).run()
