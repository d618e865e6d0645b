"""The examples in docs/guides/register-an-env.md and the env section of docs/concepts.md run
as written."""

from __future__ import annotations

from pathlib import Path

from agentrl.env import ENVS
from tests import docblocks


def test_register_an_env_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/register-an-env.md", "python")
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "register_an_env_guide"}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        for env_id in ("demo/Reverse-v0", "demo/Reverse-v1", "demo/EchoGame-v0"):
            ENVS.unregister(env_id)


def test_register_an_env_guide_commands_run(tmp_path: Path) -> None:
    """The shell commands, with "the two blocks above saved as reverse_env.py"."""
    write, register, *_ = docblocks.runnable("docs/guides/register-an-env.md", "python")
    (tmp_path / "reverse_env.py").write_text(write.code + register.code)
    (commands,) = docblocks.runnable("docs/guides/register-an-env.md", "bash")
    done = docblocks.run_bash(commands, cwd=tmp_path)
    assert "demo/Reverse-v0" in done.stdout
    assert done.stdout.count("passed") >= 2, done.stdout


def test_concepts_env_example_runs() -> None:
    blocks = docblocks.runnable("docs/concepts.md", "python")
    assert len(blocks) == 1
    docblocks.exec_blocks(blocks, {"__name__": "concepts"})
