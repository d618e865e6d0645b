"""A run whose rollouts all fail in the machinery stops with the failure, instead of idling on."""

from pathlib import Path

import pytest

from agentrl.errors import TrainingError
from agentrl.types import RolloutStatus, Sample, Trajectory, TrajectoryGroup
from trainers.config import load_run_config
from trainers.driver import Trainer


def _groups(status: RolloutStatus, error: str | None = None) -> list[TrajectoryGroup]:
    trajs = [Trajectory(sample=Sample(env_id="e"), status=status, error=error) for _ in range(4)]
    return [TrajectoryGroup(uid="g", trajectories=trajs)]


def test_consecutive_all_failed_steps_stop_the_run(tmp_path: Path) -> None:
    cfg = load_run_config("recipes/quickstart.yaml", [f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    failed = _groups(RolloutStatus.ERROR_INFERENCE, "HTTP 500: tensors on two devices")
    trainer._check_rollouts(failed, 1)
    trainer._check_rollouts(failed, 2)
    trainer._check_rollouts(_groups(RolloutStatus.COMPLETED), 3)  # one good step resets
    assert trainer.failed_steps == 0
    trainer._check_rollouts(failed, 4)
    trainer._check_rollouts(failed, 5)
    with pytest.raises(TrainingError, match=r"3 consecutive steps.*two devices"):
        trainer._check_rollouts(failed, 6)


def test_agent_failures_do_not_count_and_zero_disables(tmp_path: Path) -> None:
    cfg = load_run_config(
        "recipes/quickstart.yaml", [f"output_dir={tmp_path}", "train.max_failed_steps=0"]
    )
    trainer = Trainer(cfg)
    for step in range(5):
        trainer._check_rollouts(_groups(RolloutStatus.ERROR_INFERENCE), step)
    assert trainer.failed_steps == 5  # counted, never raised
    trainer._check_rollouts(_groups(RolloutStatus.ERROR_TOOL), 6)  # the agent's failure: learnable
    assert trainer.failed_steps == 0
