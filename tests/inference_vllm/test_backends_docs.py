"""The example in docs/guides/backends.md runs as written (it starts a real vLLM server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "backends.md"


@pytest.mark.vllm
def test_backends_guide_example_runs() -> None:
    pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 1
    namespace: dict[str, object] = {"__name__": "backends_guide"}
    exec(compile(blocks[0], f"{GUIDE.name}[block 0]", "exec"), namespace)
