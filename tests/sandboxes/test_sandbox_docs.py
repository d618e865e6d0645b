"""The runnable example in docs/guides/sandboxes.md runs as written."""

from __future__ import annotations

import pytest

from tests import docblocks
from tests.sandboxes.conftest import local_ready


@pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))
def test_guide_example_runs() -> None:
    blocks = docblocks.runnable("docs/guides/sandboxes.md", "python")
    assert "asyncio.run(" in blocks[0].code, "the guide should open with a runnable example"
    docblocks.exec_blocks(blocks, {"__name__": "guide_example"})
