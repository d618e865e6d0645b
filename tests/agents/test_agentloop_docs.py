"""The examples in docs/guides/write-an-agentloop.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.agent import AGENTS
from agentrl.env import ENVS

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "write-an-agentloop.md"


def test_write_an_agentloop_guide_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 5
    namespace: dict[str, object] = {"__name__": "write_an_agentloop_guide"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    finally:
        AGENTS.unregister("self_check")
        AGENTS.unregister("critique_2")
        ENVS.unregister("docs/Multiply-v0")
    traj = namespace["traj"]
    assert traj.metrics["turns"] == 2.0  # type: ignore[attr-defined]
