"""``benchmarks/gui.py`` at a small size: its sessions succeed, it measures both sides, and no
browser process outlives the pools or a ``kill -9`` of the process holding the sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("chromium")]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gui.py"


def test_gui_benchmark_runs_its_sessions_and_leaves_no_browser_behind() -> None:
    args = [
        "--sessions",
        "3",
        "--baseline-sessions",
        "2",
        "--episodes",
        "1",
        "--kill-sessions",
        "2",
    ]
    out = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    sides = {
        line.split(":", 1)[0]: json.loads(line.split(":", 1)[1])
        for line in lines[:-1]
        if line.startswith(("ours", "baseline", "kill"))
    }
    ours = sides["ours (one browser, a context per session)"]
    base = sides["baseline (a browser per session)"]
    kill = sides["kill -9 of a process holding 2 sessions"]
    assert (ours["sessions"], ours["episodes"], ours["errors"]) == (3, 3, 0), ours
    assert (base["sessions"], base["episodes"], base["errors"]) == (2, 2, 0), base
    # each baseline session has a browser (several processes) of its own; ours share one
    assert base["browser_processes"] > ours["browser_processes"] / 3 * 2
    assert ours["pss_mb"] > 0 and base["pss_mb"] > 0
    assert ours["left_after_shutdown"] == base["left_after_shutdown"] == 0
    assert kill["browser_processes"] > 0 and kill["left_after_kill"] == 0
    headline = json.loads(lines[-1])
    assert set(headline) == {"benchmark", "baseline", "ours", "ratio", "goal", "met"}
    assert headline["met"] is True
    assert headline["ratio"] == pytest.approx(
        base["pss_mb_per_session"] / ours["pss_mb_per_session"], abs=0.01
    )
