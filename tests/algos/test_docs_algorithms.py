"""Every Python example in docs/guides/algorithms.md runs (in order, in one namespace)."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.algos import ADV_ESTIMATORS

DOC = Path(__file__).resolve().parents[2] / "docs" / "guides" / "algorithms.md"


def test_algorithms_guide_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    try:
        for i, code in enumerate(blocks):
            exec(compile(code, f"{DOC.name}[block {i}]", "exec"), namespace)
    finally:
        ADV_ESTIMATORS.unregister("score_minus_batch_mean")
