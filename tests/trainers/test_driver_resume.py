"""Crash and resume: SIGKILL the training process after checkpoint k, resume, compare with a
run that was never interrupted. Step k+1 onwards must be the same steps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_driver import RECIPE, SMOKE, deterministic, smoke_config

from agentrl.logging import read_jsonl
from trainers.config import RunConfig
from trainers.driver import Trainer

STEPS = ["train.steps=3", "checkpoint.every=1", "checkpoint.keep_last=3", "eval.num_samples=0"]


class _LateSamplesWait:
    """The fleet's generator, but requests of samples ``first`` onwards (session ids
    ``train-N``) wait ``delay_s`` first; ``on_first`` runs at the first of them."""

    def __init__(self, inner: Any, first: int, delay_s: float, on_first: Any = None) -> None:
        self.inner, self.first, self.delay_s, self.on_first = inner, first, delay_s, on_first

    async def generate(self, *args: Any, session_id: str | None = None, **kw: Any) -> Any:
        if int((session_id or "train-0").rsplit("-", 1)[-1]) >= self.first:
            if self.on_first is not None:  # a signal handler runs on this thread later
                self.on_first, on_first = None, self.on_first
                on_first()
            await asyncio.sleep(self.delay_s)
        return await self.inner.generate(*args, session_id=session_id, **kw)


def _with_late_samples_waiting(base: type[Trainer], **wait: Any) -> type[Trainer]:
    """``base`` whose fleet generator is wrapped in ``_LateSamplesWait(**wait)``."""

    class Waiting(base):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            super().setup()
            assert self.fleet is not None and self.fleet.generator is not None
            self.fleet.generator.inner = _LateSamplesWait(self.fleet.generator.inner, **wait)

    return Waiting


def _kill_run(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver, then the inference servers it had started (they outlive it)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    servers = run_dir / "logs" / "servers.json"
    for s in json.loads(servers.read_text()) if servers.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(s["pid"]), signal.SIGKILL)


def _train_cmd(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainers.cli",
        "train",
        str(RECIPE),
        *SMOKE,
        *STEPS,
        *extra,
        f"output_dir={tmp_path}",
        f"name={name}",
    ]


def _train_until_killed(tmp_path: Path, name: str, *extra: str) -> Path:
    """``agentrl train`` in its own process (and its own Ray), as a user would run it, SIGKILLed
    once its step-1 checkpoint is written; the run dir."""
    cmd = _train_cmd(tmp_path, name, *extra)
    log_path = tmp_path / f"{name}.log"
    run_dir = tmp_path / name
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 480
            while not (run_dir / "checkpoints" / "step_000001" / "trainer_state.json").exists():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint after 8 minutes"
                time.sleep(0.2)
        finally:
            _kill_run(run_dir, proc)
    assert proc.returncode == -signal.SIGKILL
    return run_dir


@pytest.mark.slow
def test_kill_after_checkpoint_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    import ray

    from agentrl.distributed import init_ray_local

    killed_dir = _train_until_killed(tmp_path, "killed")
    init_ray_local(num_cpus=2)
    try:
        Trainer(smoke_config(tmp_path, *STEPS, "name=killed"), resume=True).run()
        Trainer(smoke_config(tmp_path, *STEPS, "name=straight")).run()
    finally:
        ray.shutdown()

    killed = read_jsonl(killed_dir / "metrics.jsonl")
    straight = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [r["step"] for r in killed] == [r["step"] for r in straight] == [1, 2, 3]
    for a, b in zip(killed[1:], straight[1:], strict=True):  # every step after the crash
        assert deterministic(a) == pytest.approx(deterministic(b), rel=1e-5, abs=1e-6)


def _trained_samples(run_dir: Path) -> dict[int, list[str]]:
    """Step -> the sample uids of every trajectory that step trained (trajectories/ logs them
    all here: trajectories.per_step is above the batch)."""
    out = {}
    for path in sorted((run_dir / "trajectories").glob("step_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]  # not read_jsonl:
        out[rows[0]["step"]] = sorted(r["sample"]["uid"] for r in rows)  # it merges a step's rows
    return out


def _data_order(cfg: RunConfig, steps: int) -> dict[int, list[str]]:
    """What a sync run trains at each step, as _trained_samples lists it: the next
    train.batch_size samples of the data stream (uids train-N), once per group member."""
    b, g = cfg.train.batch_size, cfg.rollout.group_size
    return {
        k: sorted(cfg.data.sample(i).uid for i in range((k - 1) * b, k * b) for _ in range(g))
        for k in range(1, steps + 1)
    }


@pytest.mark.slow
def test_async_run_killed_with_batches_in_flight_trains_every_sample_once(
    tmp_path: Path,
) -> None:
    """train.mode=async keeps no buffer in its checkpoints: a SIGKILL after checkpoint 1, with
    the batches of steps 2 and 3 already generating, loses them; the resumed run re-admits them
    from the data cursor. Each step then trains exactly the samples an uninterrupted sync run
    trains at that step, the next batch of the data stream (none twice, none skipped), within
    the staleness bound."""
    import ray

    from agentrl.distributed import init_ray_local

    logged = "trajectories.per_step=64"
    mode = ["train.mode=async", "train.max_staleness=2", logged]
    killed_dir = _train_until_killed(tmp_path, "killed", *mode)
    cfg = smoke_config(tmp_path, *STEPS, *mode, "name=killed")
    init_ray_local(num_cpus=2)
    try:
        Trainer(cfg, resume=True).run()
    finally:
        ray.shutdown()

    rows = read_jsonl(killed_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 2 for r in rows)
    trained = _trained_samples(killed_dir)
    assert trained == _data_order(cfg, 3)
    uids = [set(step) for step in trained.values()]
    assert sum(len(u) for u in uids) == len(set().union(*uids))  # no sample in two steps


@pytest.mark.slow
def test_async_run_interrupted_by_ctrl_c_drains_then_resumes_every_sample_once(
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT) in train.mode=async while step 1 writes its trajectory log and step 2's
    batch generates: no new batch is admitted, the admitted ones finish and are trained, a
    checkpoint of the last of them is written (checkpoint.every=0 would not have), and the run
    exits 130 with a message. Every trajectory log line is whole; the resumed run then trains,
    step by step, exactly the samples an uninterrupted sync run trains (the data stream's
    next batch)."""
    import ray

    from agentrl.distributed import init_ray_local

    steps = ["train.steps=5", "checkpoint.every=0", "eval.num_samples=0"]
    logged = "trajectories.per_step=64"
    mode = ["train.mode=async", "train.max_staleness=1", logged]
    run_dir = tmp_path / "interrupted"
    log_path = tmp_path / "interrupted.log"
    cmd = _train_cmd(tmp_path, "interrupted", *steps, *mode)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 480
            while not (run_dir / "trajectories" / "step_000001.jsonl").exists():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no step 1 after 8 minutes"
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(300)
        finally:
            if proc.poll() is None:
                _kill_run(run_dir, proc)
    text = log_path.read_text()
    assert code == 128 + signal.SIGINT, text[-3000:]
    assert "Ctrl-C: no new rollouts; waiting up to 300 s" in text, text[-3000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    last = rows[-1]["step"]
    assert re.search(rf"Ctrl-C: drained; trained steps [12]\.\.{last} after it", text), text[-3000:]
    assert [r["step"] for r in rows] == list(range(1, last + 1))
    assert 2 <= last < 5  # the admitted batches were trained, nothing new was admitted
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == [f"step_{last:06d}"]  # written by the drain, nothing half-saved
    for path in (run_dir / "trajectories").glob("*.jsonl"):  # every line whole JSON
        assert all(json.loads(line) for line in path.read_text().splitlines())

    cfg = smoke_config(tmp_path, *steps, *mode, "name=interrupted")
    init_ray_local(num_cpus=2)
    try:
        Trainer(cfg, resume=True).run()
    finally:
        ray.shutdown()
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    trained = _trained_samples(run_dir)
    assert trained == _data_order(cfg, 5)
    uids = [set(step) for step in trained.values()]
    assert sum(len(u) for u in uids) == len(set().union(*uids))  # no sample in two steps


@pytest.mark.slow
@pytest.mark.parametrize("second_ctrl_c", [False, True])
def test_ctrl_c_drain_past_its_timeout_or_a_second_ctrl_c_cancels(
    tmp_path: Path, second_ctrl_c: bool
) -> None:
    """The drain's bounds, through the driver: rollouts of step 2 onwards hang; Ctrl-C after
    step 1 waits train.drain_timeout_s (1 s) for them, cancels them, checkpoints step 1 (with
    checkpoint.every=0) at data cursor = one batch, and exits 130. Or, with a 600 s timeout, a
    second Ctrl-C 2 s later cancels at once (KeyboardInterrupt; the last checkpoint stays the
    last periodic one: none here)."""
    import threading

    import ray

    from agentrl.distributed import init_ray_local

    batch = 2  # SMOKE's train.batch_size

    # step 2 onwards: still generating at the Ctrl-C
    hanging = _with_late_samples_waiting(Trainer, first=batch, delay_s=600)

    class Interrupted(hanging):  # type: ignore[valid-type,misc]
        def step(self) -> dict[str, float]:
            out = super().step()
            os.kill(os.getpid(), signal.SIGINT)  # the handler only sets the drain's flag
            if second_ctrl_c:
                threading.Timer(2.0, os.kill, args=(os.getpid(), signal.SIGINT)).start()
            return out

    steps = ["train.steps=4", "checkpoint.every=0", "eval.num_samples=0"]
    timeout = 600 if second_ctrl_c else 1
    mode = ["train.mode=async", "train.max_staleness=1", f"train.drain_timeout_s={timeout}"]
    cfg = smoke_config(tmp_path, *steps, *mode, "name=timeout")
    init_ray_local(num_cpus=2)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt if second_ctrl_c else SystemExit) as exit_info:
            Interrupted(cfg).run()
    finally:
        ray.shutdown()
    assert time.monotonic() - t0 < 300
    assert [r["step"] for r in read_jsonl(cfg.run_dir / "metrics.jsonl")] == [1]
    if second_ctrl_c:
        assert not list((cfg.run_dir / "checkpoints").glob("step_*"))
        return
    assert isinstance(exit_info.value, SystemExit)
    assert exit_info.value.code == 128 + signal.SIGINT
    ckpts = sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_000001"]
    state = json.loads((cfg.run_dir / "checkpoints" / ckpts[0] / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["data_cursor"] == batch


@pytest.mark.slow
def test_sync_ctrl_c_finishes_the_step_under_way(tmp_path: Path) -> None:
    """train.mode=sync, Ctrl-C while step 2 generates (each of its requests waits 0.5 s): its
    rollouts finish, step 2 trains and is checkpointed (checkpoint.every=0 would not have) and
    the run exits 130. Past train.drain_timeout_s the rollouts are cancelled instead and the
    cursor rewound: tests/trainers/test_failed_rollouts.py."""

    import ray

    from agentrl.distributed import init_ray_local

    batch = 2  # SMOKE's train.batch_size
    ctrl_c = lambda: os.kill(os.getpid(), signal.SIGINT)  # noqa: E731 (sets the drain's flag)
    Interrupted = _with_late_samples_waiting(Trainer, first=batch, delay_s=0.5, on_first=ctrl_c)

    steps = ["train.steps=4", "checkpoint.every=0", "eval.num_samples=0"]
    cfg = smoke_config(tmp_path, *steps, "train.drain_timeout_s=600")
    init_ray_local(num_cpus=2)
    try:
        with pytest.raises(SystemExit) as exit_info:
            Interrupted(cfg).run()
    finally:
        ray.shutdown()
    assert exit_info.value.code == 128 + signal.SIGINT
    assert [r["step"] for r in read_jsonl(cfg.run_dir / "metrics.jsonl")] == [1, 2]
    ckpts = sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_000002"]
    state = json.loads((cfg.run_dir / "checkpoints" / ckpts[0] / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["data_cursor"] == 2 * batch
