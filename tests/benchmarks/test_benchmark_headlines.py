"""``benchmarks/weight_sync.py`` and ``benchmarks/sandbox.py`` end with their one-line JSON
headline (keys ``benchmark, baseline, ours, ratio, goal, met``), on the smallest settings.
No figure is checked: tests do not time things."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["benchmark", "baseline", "ours", "ratio", "goal", "met"]


def _headline(script: str, *args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(last) == KEYS, last
    return last


def test_weight_sync_headline_is_the_verified_ipc_sync_over_the_warm_copy() -> None:
    got = _headline("weight_sync.py", "--models", "tiny", "--paths", "ipc", "--repeats", "2")
    assert "ipc push + verify" in str(got["ours"]) and "memcpy-warm" in str(got["baseline"])
    assert isinstance(got["ratio"], float) and got["met"] == (got["ratio"] <= 5)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_sandbox_headline_without_swerex_says_what_was_not_measured() -> None:
    got = _headline("sandbox.py", "--n", "2", "--sandboxes", "1", "--per-sandbox", "1",
                    "--targets", "local,pipe-shell")  # fmt: skip
    assert got["ratio"] is None and got["met"] is None and "not measured" in str(got["baseline"])
    assert "local (exec agent)" in str(got["ours"])
