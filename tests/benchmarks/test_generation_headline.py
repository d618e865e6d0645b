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
