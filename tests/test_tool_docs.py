"""The examples in docs/guides/write-a-tool.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.tool import TOOLS

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "write-a-tool.md"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_write_a_tool_guide_examples_run() -> None:
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "write_a_tool_guide"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    finally:
        TOOLS.unregister("convert")
