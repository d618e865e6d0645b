"""``benchmarks/async_rl.py --workload longtail`` (the issue-23 workload, bench/LongTail-v0)
runs sync, one_step_off and async on the smallest settings and ends with its JSON headline.
No figure is checked: tests do not time things. Slow (~100 s: three training runs), so it
runs in CI's slow step, not in the default suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_longtail_smoke_reports_every_mode_and_the_headline() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "async_rl.py"),
            "--workload=longtail",
            "--smoke",
            "--steps=2",
            "--sft-steps=1",
            "--batch-size=2",
            "--seeds=0",
            "--max-calls=3",
            "--latency-scale=0.1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    runs = [json.loads(x) for x in lines if x.startswith('{"mode"')]
    assert [r["mode"] for r in runs] == ["sync", "one_step_off", "async"]
    # an overlapped run's trainer waits at least for its first batch; sync logs no wait
    assert runs[2]["first_wait_s"] > 0 and runs[2]["trainer_wait_s"] >= runs[2]["first_wait_s"]
    assert runs[0]["trainer_wait_s"] == 0
    for mode in ("sync", "one_step_off", "async"):
        assert any(x.startswith(mode) and "reward(last 20%)" in x for x in lines), mode
        assert any(x.startswith(f"reward vs trained samples, {mode}:") for x in lines)
    assert any("tool waiting on sync's critical path" in x for x in lines)
    head = json.loads(lines[-1])
    assert list(head) == ["benchmark", "baseline", "ours", "ratio", "goal", "met"]
    assert head["benchmark"] == "async_rl (longtail, cpu)" and head["goal"] == 2.5
    assert head["met"] is False  # one seed has no standard error, so the goal cannot be met
