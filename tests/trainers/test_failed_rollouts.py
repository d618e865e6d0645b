"""The driver under failures: rollouts that fail in the machinery, filtering that runs dry, interrupts."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import TrainingError
from agentrl.types import RolloutStatus, Sample, Trajectory, TrajectoryGroup
from trainers.checkpoint import TrainerState
from trainers.config import load_run_config
from trainers.driver import Trainer
from trainers.serving import Fleet


def _groups(status: RolloutStatus, error: str | None = None) -> list[TrajectoryGroup]:
    trajs = [Trajectory(sample=Sample(env_id="e"), status=status, error=error) for _ in range(4)]
    return [TrajectoryGroup(uid="g", trajectories=trajs)]


def test_consecutive_all_failed_steps_stop_the_run(tmp_path: Path) -> None:
    cfg = load_run_config("recipes/quickstart.yaml", [f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    failed = _groups(RolloutStatus.ERROR_INFERENCE, "HTTP 500: tensors on two devices")
    trainer.failures.check(failed, 1)
    trainer.failures.check(failed, 2)
    trainer.failures.check(_groups(RolloutStatus.COMPLETED), 3)  # one good step resets
    assert trainer.failures.failed_steps == 0
    trainer.failures.check(failed, 4)
    trainer.failures.check(failed, 5)
    with pytest.raises(TrainingError, match=r"3 consecutive steps.*two devices"):
        trainer.failures.check(failed, 6)


def test_agent_failures_do_not_count_and_zero_disables(tmp_path: Path) -> None:
    cfg = load_run_config(
        "recipes/quickstart.yaml", [f"output_dir={tmp_path}", "train.max_failed_steps=0"]
    )
    trainer = Trainer(cfg)
    for step in range(5):
        trainer.failures.check(_groups(RolloutStatus.ERROR_INFERENCE), step)
    assert trainer.failures.failed_steps == 5  # counted, never raised
    trainer.failures.check(_groups(RolloutStatus.ERROR_TOOL), 6)  # the agent's failure: learnable
    assert trainer.failures.failed_steps == 0


def _mixed(failed: int, total: int = 4) -> list[TrajectoryGroup]:
    trajs = [
        Trajectory(
            sample=Sample(env_id="e"),
            status=RolloutStatus.ERROR_ENV if i < failed else RolloutStatus.COMPLETED,
            error="EnvError: boom" if i < failed else None,
        )
        for i in range(total)
    ]
    return [TrajectoryGroup(uid="g", trajectories=trajs)]


def test_steps_mostly_of_env_errors_warn_then_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_run_config("recipes/quickstart.yaml", [f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    trainer.failures.check(_mixed(1), 1)  # 25%: below train.max_error_rate=0.5
    assert trainer.failures.failed_steps == 0 and not caplog.records
    trainer.failures.check(_mixed(3), 2)
    assert "3 of 4 rollouts failed" in caplog.text and "boom" in caplog.text
    trainer.failures.check(_mixed(3), 3)
    with pytest.raises(TrainingError, match=r"train\.max_error_rate=0\.5.*3 of 4"):
        trainer.failures.check(_mixed(3), 4)


def test_a_non_finite_env_reward_is_an_env_error_not_a_number() -> None:
    import asyncio

    from agentrl.agent import RolloutContext
    from agentrl.chat import ChatTemplate
    from agentrl.env import Env
    from agentrl.errors import EnvError
    from agentrl.rollout.testing import ScriptedGenerator
    from agentrl.tiny import build_tokenizer
    from agentrl.types import Message, user

    class NaNReward(Env):
        async def areset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            await super().areset(seed=seed)
            return [user("hi")], {}

        async def astep(self, action):  # type: ignore[no-untyped-def]
            return [], float("nan"), True, False, {}

    template = ChatTemplate(build_tokenizer())
    ctx = RolloutContext(
        sample=Sample(env_id="nan"),
        generator=ScriptedGenerator(template, ["x"]),
        template=template,
        env=NaNReward(),
    )

    async def episode() -> None:
        await ctx.reset()
        await ctx.step(Message(role="assistant", content="x"))

    with pytest.raises(EnvError, match="non-finite reward"):
        asyncio.run(episode())


def test_filtering_that_runs_out_of_rounds_pads_the_batch_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_run_config(
        "recipes/quickstart.yaml",
        [
            f"output_dir={tmp_path}",
            "algo.filter_groups=true",
            "algo.max_filter_rounds=2",
            "train.batch_size=4",
            "train.mini_batch_size=2",
        ],
    )
    calls: list[int] = []

    class OneSignalPerRound:
        generator = None
        collect = Fleet.collect  # the real one, over this loop and collector

        def run(self, rollouts: Any) -> Any:  # the Fleet's loop
            return asyncio.run(rollouts)

        async def collect_ordered(self, samples: list[Sample]) -> list[TrajectoryGroup]:
            calls.append(len(samples))
            out = []
            for i, s in enumerate(samples):
                rewards = [0.0, 1.0] if i == 0 else [0.0, 0.0]  # only the first has signal
                trajs = [Trajectory(sample=s, reward=r) for r in rewards]
                out.append(TrajectoryGroup(uid=s.uid, trajectories=trajs))
            return out

    trainer = Trainer(cfg)
    trainer.fleet = trainer.collector = OneSignalPerRound()  # type: ignore[assignment]
    groups, metrics = trainer.collect()
    assert calls == [4, 3]  # the second round asks only for what is missing
    assert len(groups) == 4 and metrics["rollout/filter_padded_groups"] == 2.0
    assert sum(len(set(g.rewards_G)) > 1 for g in groups) == 2
    assert "algo.max_filter_rounds=2" in caplog.text
    assert trainer.cursor == 7  # every drawn sample counts, padded or not


def test_an_interrupted_run_says_how_to_resume(tmp_path: Path) -> None:
    cfg = load_run_config("recipes/quickstart.yaml", [f"output_dir={tmp_path}", "name=r"])
    trainer = Trainer(cfg, command="agentrl train recipes/quickstart.yaml name=r")
    assert "no checkpoint" in trainer.resume_hint()
    ckpt = trainer.ckpt.begin(3)
    trainer.ckpt.commit(ckpt, TrainerState(step=3, weight_version=3, data_cursor=24, rng={}))
    hint = trainer.resume_hint()
    assert "step_000003" in hint
    assert hint.endswith("agentrl train recipes/quickstart.yaml name=r --resume")


def test_worker_groups_already_started_are_shut_down_when_a_later_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A critic that cannot start (no GPU, a bad model path) must not leave the actor's Ray
    actors running: build_roles shuts the started groups down before the error propagates."""
    import trainers.workers as workers

    started: list[str] = []
    stopped: list[str] = []

    class FakeGroup:
        def __init__(self, pool: object, cls: type, *, kwargs: dict, share: float, name: str):
            if name == "critic":
                raise RuntimeError("critic: CUDA out of memory")
            assert share == pytest.approx(1 / 3)  # actor, ref and critic share the pool
            self.name = name
            started.append(name)

        def shutdown(self) -> None:
            stopped.append(self.name)

    monkeypatch.setattr(workers, "WorkerGroup", FakeGroup)
    cfg = load_run_config(
        "recipes/quickstart.yaml",
        [f"output_dir={tmp_path}", "algo.kl.coef=0.01", "algo.adv_estimator=gae"],
    )
    with pytest.raises(RuntimeError, match="out of memory"):
        workers.build_roles(cfg, object(), tmp_path, num_threads=1)  # type: ignore[arg-type]
    assert started == ["actor", "ref"] and stopped == ["ref", "actor"]


def test_sync_ctrl_c_past_the_drain_timeout_cancels_the_step_and_rewinds_the_cursor(
    tmp_path: Path,
) -> None:
    """After a Ctrl-C in sync the step's rollouts get train.drain_timeout_s; past it they are
    cancelled (DrainTimeout, which the run loop turns into a checkpoint and exit 130) and the
    data cursor goes back to the step's first sample, so a resume redoes the step whole. The
    path through a real run: test_driver_resume.py's test_sync_ctrl_c_finishes_the_step_under_way."""
    import time

    from trainers.async_rollout import DrainTimeout

    cfg = load_run_config("recipes/quickstart.yaml", [f"output_dir={tmp_path}"])
    cancelled: list[bool] = []

    class Hangs:
        generator = None
        collect = Fleet.collect

        def run(self, rollouts: Any) -> Any:
            return asyncio.run(rollouts)

        async def collect_ordered(self, samples: list[Sample]) -> list[TrajectoryGroup]:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return []

    trainer = Trainer(cfg)
    trainer.fleet = trainer.collector = Hangs()  # type: ignore[assignment]
    trainer.cursor = 40
    trainer.ctrl_c.interrupted = True
    trainer.ctrl_c._deadline = time.monotonic() + 0.2  # what the first Ctrl-C sets
    with pytest.raises(DrainTimeout, match=r"train\.drain_timeout_s"):
        trainer.collect()
    assert cancelled == [True]
    assert trainer.cursor == 40
