"""Every Python example in docs/guides/algorithms.md runs (in order, in one namespace)."""

from __future__ import annotations

from agentrl.algos import ADV_ESTIMATORS
from tests import docblocks


def test_algorithms_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/algorithms.md", "python")
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        ADV_ESTIMATORS.unregister("score_minus_batch_mean")
