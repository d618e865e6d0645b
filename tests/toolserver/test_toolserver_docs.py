"""The examples in docs/guides/tool-server.md run as written."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from tests.toolserver.conftest import TOKEN

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "tool-server.md"


def test_tool_server_guide_examples_run(sandbox_server: tuple[object, str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 4
    namespace: dict[str, object] = {"__name__": "tool_server_guide"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    use_remote = namespace["use_remote"]
    asyncio.run(use_remote(sandbox_server[1], TOKEN))  # type: ignore[operator]
