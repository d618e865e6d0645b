"""The examples in docs/guides/register-an-env.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.env import ENVS

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "register-an-env.md"


def test_register_an_env_guide_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "register_an_env_guide"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    finally:
        ENVS.unregister("demo/Reverse-v0")
