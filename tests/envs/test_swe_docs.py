"""The examples in docs/guides/swe.md run as written (from the repository root)."""

from __future__ import annotations

import os

from tests import docblocks


def test_swe_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/swe.md", "python")
    assert len(blocks) >= 2
    cwd = os.getcwd()
    os.chdir(docblocks.ROOT)  # the split example reads data/swe/tasks.jsonl
    try:
        docblocks.exec_blocks(blocks, {"__name__": "swe_guide"})
    finally:
        os.chdir(cwd)
