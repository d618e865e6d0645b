"""The README's examples run as written and do what they say (it is the site's home page)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrl.agent import AGENTS
from agentrl.env import ENVS, make_env
from agentrl.types import Message
from tests import docblocks

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run() -> None:
    blocks = docblocks.runnable("README.md", "python")
    assert len(blocks) >= 3
    ns: dict[str, object] = {"__name__": "readme"}
    try:
        docblocks.exec_blocks(blocks, ns)
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


def test_readme_shell_tour_runs(tmp_path: Path) -> None:
    """The quick commands of the tour; ./my_envs.py is the README's env example."""
    echo, *_ = docblocks.runnable("README.md", "python")
    (tmp_path / "my_envs.py").write_text(echo.code)
    (tour,) = docblocks.runnable("README.md", "bash")
    done = docblocks.run_bash(
        tour, cwd=tmp_path, overrides={"agentrl model tiny /tmp/tiny": "agentrl model tiny tiny"}
    )
    assert "demo/Echo-v0" in done.stdout and "calculator" in done.stdout
    assert (tmp_path / "tiny" / "config.json").exists()


def test_readme_names_the_setup_and_test_commands() -> None:
    text = README.read_text()
    assert "pip install -c constraints/cpu.txt -e" in text
    assert "agentrl train recipes/quickstart.yaml" in text
    assert "python -m pytest" in text
    assert "mkdocs build --strict" in text  # the docs site
