"""The examples in docs/guides/inference.md run as written (each starts a real server)."""

from __future__ import annotations

import pytest

from tests import docblocks


@pytest.mark.slow
def test_inference_guide_examples_run() -> None:
    # marked no-test on the page (each starts a server): this slow test runs them all
    blocks = docblocks.blocks("docs/guides/inference.md", "python")
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "inference_guide"}
    docblocks.exec_blocks(blocks, namespace)
