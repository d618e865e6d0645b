"""The example in docs/guides/backends.md runs as written (it starts a real vLLM server)."""

from __future__ import annotations

import pytest

from tests import docblocks


@pytest.mark.vllm
def test_backends_guide_example_runs() -> None:
    pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
    # marked no-test on the page (it needs vLLM): `pytest -m vllm` runs it
    blocks = docblocks.blocks("docs/guides/backends.md", "python")
    assert len(blocks) == 1
    namespace: dict[str, object] = {"__name__": "backends_guide"}
    docblocks.exec_blocks(blocks, namespace)
