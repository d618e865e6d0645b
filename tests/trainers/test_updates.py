"""One epoch loop for actor, critic and SFT, with losses as plain picklable objects."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from agentrl.batch import TrainBatch
from agentrl.engine import LossFn
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup
from trainers.updates import (
    CriticLoss,
    CriticUpdate,
    NllLoss,
    PolicyLoss,
    PolicyUpdate,
    run_epochs,
)


def _batch(rows: int) -> TrainBatch:
    groups = []
    for i in range(rows):
        seg = Segment(
            token_ids=[1, 2, 3, 4],
            loss_mask=[0, 0, 1, 1],
            logprobs=[0.0, 0.0, -1.0, -1.0],
            versions=[-1, -1, 0, 0],
        )
        traj = Trajectory(sample=Sample(env_id="t", uid=f"u{i}"), segments=[seg])
        groups.append(TrajectoryGroup(uid=f"u{i}", trajectories=[traj]))
    return TrainBatch.from_groups(groups, pad_token_id=0)


class RecordingEngine:
    """Counts forward/backward and optimizer steps; reports what a real engine reports."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Any, float, bool]] = []
        self.steps = 0

    def forward_backward(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        self.calls.append((len(batch), loss_fn, temperature, with_entropy))
        return {"train/ppo_kl": 0.1 * len(self.calls), "critic/vf_loss": 1.0}

    def optimizer_step(self) -> dict[str, float]:
        self.steps += 1
        return {"train/grad_norm": float(self.steps)}


def test_epochs_times_mini_batches_optimizer_steps_with_the_first_step_kept() -> None:
    engine = RecordingEngine()
    loss = PolicyLoss(PolicyUpdate())
    out = run_epochs(
        engine,
        _batch(8),
        loss,
        epochs=3,
        num_mini_batches=4,
        temperature=0.7,  # type: ignore[arg-type]
        with_entropy=True,
    )
    assert engine.steps == 12 and [c[0] for c in engine.calls] == [2] * 12
    assert all(c[1] is loss and c[2] == 0.7 and c[3] for c in engine.calls)
    assert out["train/optimizer_steps"] == 12.0
    assert out["train/ppo_kl_first"] == 0.1  # the first mini-batch, not the mean
    assert abs(out["train/grad_norm"] - 6.5) < 1e-9  # mean over the 12 steps


def test_the_critic_reports_engine_metrics_under_its_own_prefix() -> None:
    engine = RecordingEngine()
    out = run_epochs(
        engine,
        _batch(4),
        CriticLoss(CriticUpdate()),
        epochs=2,  # type: ignore[arg-type]
        num_mini_batches=2,
        prefix="critic",
    )
    assert out["critic/grad_norm"] == 2.5 and out["critic/optimizer_steps"] == 4.0
    assert out["critic/vf_loss"] == 1.0
    assert not any(k.startswith("train/") for k in out)
    assert "critic/ppo_kl_first" in out  # renamed from the engine's train/ppo_kl


def test_more_mini_batches_than_rows_gives_one_row_each() -> None:
    engine = RecordingEngine()
    run_epochs(engine, _batch(3), NllLoss(), num_mini_batches=8)  # type: ignore[arg-type]
    assert [c[0] for c in engine.calls] == [1, 1, 1]


def test_losses_are_objects_that_cross_process_boundaries() -> None:
    for loss in (PolicyLoss(PolicyUpdate(kl_coef=0.1)), CriticLoss(CriticUpdate()), NllLoss()):
        assert pickle.loads(pickle.dumps(loss)) == loss


def test_nll_loss_is_normalised_by_the_global_token_count() -> None:
    from agentrl.engine import MicroBatch

    batch = _batch(2)
    mask = batch.loss_mask
    assert mask.sum() == 4  # two generated tokens a row
    logprobs = torch.where(mask.bool(), -1.5, -9.0)  # -9 off the mask must not count
    mb = MicroBatch(
        batch=batch, index=0, count=1, global_num_loss_tokens=8.0, global_num_rows=4.0, dp_size=2
    )
    loss, metrics = NllLoss()(logprobs, None, None, mb)
    assert torch.isclose(loss, torch.tensor(0.75))  # 4 tokens x 1.5 / 8 tokens over all ranks
    assert metrics["sft/loss"] == 1.5  # x count x dp_size: the engine averages over pieces


def test_nll_loss_with_a_prompt_weight_adds_the_other_real_tokens() -> None:
    """Rows [1, 2, 3, 4] with targets at 3 and 4: the prompt term covers token 2 only (token
    1 has nothing before it; padding and targets are not in it)."""
    from agentrl.engine import MicroBatch

    batch = _batch(2)
    logprobs = torch.tensor([[-7.0, -2.0, -1.5, -1.5]] * 2)
    mb = MicroBatch(
        batch=batch, index=0, count=1, global_num_loss_tokens=4.0, global_num_rows=2.0, dp_size=1
    )
    plain, m0 = NllLoss()(logprobs, None, None, mb)
    loss, m = NllLoss(prompt_weight=0.5)(logprobs, None, None, mb)
    assert torch.isclose(plain, torch.tensor(1.5)) and "sft/prompt_loss" not in m0
    # targets: 4 x 1.5 / 4; prompt: 0.5 x (2 rows x 2.0) / 4 target tokens
    assert torch.isclose(loss, torch.tensor(1.5 + 0.5 * 4.0 / 4))
    assert m["sft/loss"] == 1.5 and m["sft/prompt_loss"] == 2.0
    assert pickle.loads(pickle.dumps(NllLoss(0.5))) == NllLoss(0.5)
