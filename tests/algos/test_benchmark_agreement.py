"""The benchmark's naive per-sample references agree with the vectorised algorithms."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "algos.py"


def _load_benchmark():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("agentrl_bench_algos", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("batch", "seq", "group_size", "seed"), [(16, 96, 4, 0), (9, 130, 3, 1), (8, 128, 2, 2)]
)
def test_vectorised_algorithms_agree_with_naive_loops(
    batch: int, seq: int, group_size: int, seed: int
) -> None:
    results = _load_benchmark().check_agreement(batch, seq, group_size, seed)
    assert len(results) >= 14
    bad = {name: err for name, (ok, err) in results.items() if not ok}
    assert not bad, f"disagreeing cases (max abs error): {bad}"
