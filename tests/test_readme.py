"""The README's Python examples run as written and do what they say."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from agentrl.agent import AGENTS
from agentrl.env import ENVS, make_env
from agentrl.types import Message

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    ns: dict[str, object] = {"__name__": "readme"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"README.md[block {i}]", "exec"), ns)
        env = make_env("demo/Echo-v0")
        obs, _ = asyncio.run(env.areset(seed=0))
        assert obs[0].text == "Say hi."
        _, reward, terminated, _, _ = asyncio.run(
            env.astep(Message(role="assistant", content="Hi!"))
        )
        assert reward == 1.0 and terminated
        assert "two_tries" in AGENTS
    finally:
        ENVS.unregister("demo/Echo-v0")
        AGENTS.unregister("two_tries")


def test_readme_names_the_setup_and_test_commands() -> None:
    text = README.read_text()
    assert "pip install -c constraints/cpu.txt -e" in text
    assert "agentrl train recipes/quickstart.yaml" in text
    assert "python -m pytest" in text
