"""``benchmarks/generation.py`` ends with its two JSON headlines (static engine against the
dynamic one, then against transformers' static-cache generate), on the smallest CPU settings.
No figure is checked: tests do not time things."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.test_benchmark_headlines import _headlines


def test_generation_headlines_compare_the_static_engine(tmp_path: Path) -> None:
    old, hf = _headlines(
        "generation.py",
        *("--device", "cpu", "--layers", "1", "--hidden", "32", "--heads", "2"),
        *("--concurrency", "2,3", "--paths", "server-static,server-dynamic"),
        *("--model", str(tmp_path / "model"), "--out", str(tmp_path / "out")),
    )
    assert str(old["benchmark"]).endswith("(server-static)")  # compiled path not run here
    assert "dynamic engine" in str(old["baseline"]) and isinstance(old["ratio"], float)
    assert old["met"] == (old["ratio"] >= 10.0)
    assert "not measured" in str(hf["baseline"]) and hf["ratio"] is None and hf["met"] is False


def test_a_run_stopped_by_sigterm_still_reports_what_it_measured(tmp_path: Path) -> None:
    """``timeout`` ends a GPU run with SIGTERM: the path running stops (its server with it) and
    the headlines still come, from the figures measured before."""
    import json
    import signal
    import subprocess
    import sys

    from tests.benchmarks.test_benchmark_headlines import ROOT

    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "generation.py"),
            *("--device", "cpu", "--layers", "1", "--hidden", "32", "--heads", "2"),
            *("--concurrency", "2,3", "--paths", "server-static,server-dynamic,hf-static"),
            *("--model", str(tmp_path / "model"), "--out", str(tmp_path / "out")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # bounded: the script ends on its own if no line matches
        seen.append(line)
        if line.startswith("server-dynamic ready"):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    lines = [*seen, *out.splitlines(keepends=True)]
    assert proc.returncode == 0, err[-3000:]
    assert "stopped: reporting the figures measured so far" in err
    old, hf = [json.loads(x) for x in lines[-2:]]
    assert old["benchmark"].endswith("(server-static)") and old["ours"] > 0
    assert not any(x.startswith("hf-static") for x in lines)  # never started
    assert "not measured" in hf["baseline"] and hf["met"] is False
    measured = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(measured["server-static"]) == {"2", "3"}
