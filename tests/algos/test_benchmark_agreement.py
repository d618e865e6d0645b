"""benchmarks/algos.py: agentrl's algorithms agree with verl's own on small batches.

verl lives in the benchmark's own venv (``python benchmarks/algos.py --setup-verl``); without
it this test is skipped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "algos.py"
VERL_PYTHON = BENCH.parent / ".venv-verl" / "bin" / "python"


@pytest.mark.skipif(not VERL_PYTHON.exists(), reason="no benchmarks/.venv-verl (--setup-verl)")
def test_agentrl_algorithms_agree_with_verl() -> None:
    proc = subprocess.run(
        [str(VERL_PYTHON), str(BENCH), "--check"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cases"] >= 18 and not any(report["disagree"].values())
