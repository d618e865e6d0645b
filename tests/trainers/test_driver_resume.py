"""Crash and resume: SIGKILL the training process after checkpoint k, resume, compare with a
run that was never interrupted. Step k+1 onwards must be the same steps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_driver import RECIPE, SMOKE, deterministic, smoke_config

from agentrl.logging import read_jsonl
from trainers.driver import Trainer

STEPS = ["train.steps=3", "checkpoint.every=1", "checkpoint.keep_last=3", "eval.num_samples=0"]


def _kill_run(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver, then the inference servers it had started (they outlive it)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    servers = run_dir / "logs" / "servers.json"
    for s in json.loads(servers.read_text()) if servers.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(s["pid"]), signal.SIGKILL)


@pytest.mark.slow
def test_kill_after_checkpoint_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    import ray

    from agentrl.distributed import init_ray_local

    # The run that gets killed: its own process (and its own Ray), as `agentrl train` would be.
    cmd = [
        sys.executable,
        "-m",
        "trainers.cli",
        "train",
        str(RECIPE),
        *SMOKE,
        *STEPS,
        f"output_dir={tmp_path}",
        "name=killed",
    ]
    log = (tmp_path / "killed.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    killed_dir = tmp_path / "killed"
    try:
        deadline = time.monotonic() + 480
        while not (killed_dir / "checkpoints" / "step_000001" / "trainer_state.json").exists():
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 8 minutes"
            time.sleep(0.2)
    finally:
        _kill_run(killed_dir, proc)
    assert proc.returncode == -signal.SIGKILL

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
