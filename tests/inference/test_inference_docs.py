"""The examples in docs/guides/inference.md run as written (each starts a real server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "inference.md"


@pytest.mark.slow
def test_inference_guide_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "inference_guide"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
