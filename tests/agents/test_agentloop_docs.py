"""The examples in docs/guides/write-an-agentloop.md run as written."""

from __future__ import annotations

from agentrl.agent import AGENTS
from agentrl.env import ENVS
from tests import docblocks


def test_write_an_agentloop_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/write-an-agentloop.md", "python")
    assert len(blocks) == 6
    namespace: dict[str, object] = {"__name__": "write_an_agentloop_guide"}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        AGENTS.unregister("self_check")
        AGENTS.unregister("critique_2")
        AGENTS.unregister("short_tools")
        ENVS.unregister("docs/Multiply-v0")
        ENVS.unregister("docs/Health-v0")
    traj = namespace["traj"]
    assert traj.metrics["turns"] == 2.0  # type: ignore[attr-defined]
