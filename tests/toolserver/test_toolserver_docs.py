"""The examples in docs/guides/tool-server.md run as written."""

from __future__ import annotations

import asyncio

from tests import docblocks
from tests.toolserver.conftest import TOKEN


def test_tool_server_guide_examples_run(sandbox_server: tuple[object, str]) -> None:
    blocks = docblocks.runnable("docs/guides/tool-server.md", "python")
    assert len(blocks) == 4
    namespace: dict[str, object] = {"__name__": "tool_server_guide"}
    docblocks.exec_blocks(blocks, namespace)
    use_remote = namespace["use_remote"]
    asyncio.run(use_remote(sandbox_server[1], TOKEN))  # type: ignore[operator]
