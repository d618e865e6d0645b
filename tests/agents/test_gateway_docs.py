"""The examples in docs/guides/gateway.md run as written."""

from __future__ import annotations

from agentrl.agent import AGENTS
from agentrl.env import ENVS
from agentrl.types import RolloutStatus
from tests import docblocks


def test_gateway_guide_example_records_a_tool_calling_agent() -> None:
    blocks = docblocks.runnable("docs/guides/gateway.md", "python")
    assert len(blocks) == 1
    namespace: dict[str, object] = {"__name__": "gateway_guide"}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        AGENTS.unregister("my_agent")
        ENVS.unregister("docs/Add-v0")
    traj = namespace["traj"]
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0  # type: ignore[attr-defined]
    assert len(traj.turns) == 2 and len(traj.segments) == 1  # type: ignore[attr-defined]
