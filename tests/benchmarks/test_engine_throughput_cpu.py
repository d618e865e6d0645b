"""``benchmarks/engine_throughput.py`` driver on CPU: rounds, per-run JSON, the summary table.

The GPU figures come from the same driver, so a driver bug costs GPU time; this runs the torch
engine in fp32 on a one-layer model, two rounds, each in its own process, as on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "engine_throughput.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_rounds_write_every_run_and_summarise_per_engine(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = _run(
        "--device=cpu",
        "--engines=torch",
        "--rounds=2",
        "--layers=1",
        "--hidden=32",
        "--heads=2",
        "--seq=16",
        "--batch=2",
        "--steps=2",
        "--warmup=1",
        f"--model={tmp_path / 'model'}",
        f"--json={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert [(r["engine"], r["round"]) for r in runs] == [("torch", 0), ("torch", 1)]
    assert all(r["tokens_per_s"] > 0 and r["device"] == "cpu" for r in runs)
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("torch ")]
    assert len(rows) == 1, proc.stdout  # one summary row per engine, not per round
    lo, hi = (float(x) for x in rows[0][2].split("-"))
    assert lo <= float(rows[0][1]) <= hi  # the median lies within the range
    assert rows[0][5] == "1.00x"


def test_unknown_engine_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = _run("--device=cpu", "--engines=torch,megatorn", f"--model={tmp_path / 'model'}")
    assert proc.returncode == 2
    assert "unknown engine(s) ['megatorn']" in proc.stderr
    assert not (tmp_path / "model").exists()
