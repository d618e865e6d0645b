"""The examples in docs/guides/write-a-tool.md run as written."""

from __future__ import annotations

from agentrl.tool import TOOLS
from tests import docblocks


def test_write_a_tool_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/write-a-tool.md", "python")
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "write_a_tool_guide"}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        TOOLS.unregister("convert")
