"""A recipe's ``modules`` (and ``--module``) import user code before names are resolved."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.agent import AGENTS
from agentrl.errors import ConfigError, UnknownIdError
from trainers.config import load_run_config

LOOPS = """
from agentrl.agent import AgentLoop, register_agent


class Mine(AgentLoop):
    async def run(self, sample, ctx):
        await ctx.reset()
        await ctx.step((await ctx.generate()).message)


register_agent("test-modules/mine", Mine)
"""

BASE = ["data.envs=[{id: arith/Calculator-v0}]", "rollout.agent=test-modules/mine"]


@pytest.fixture
def cwd_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "my_run_loops.py").write_text(LOOPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_run_loops", raising=False)
    yield tmp_path
    AGENTS.unregister("test-modules/mine")


def test_recipe_modules_register_the_agentloop_it_names(cwd_module: Path) -> None:
    with pytest.raises(UnknownIdError, match="--module YOUR_MODULE"):
        load_run_config(None, BASE)
    cfg = load_run_config(None, [*BASE, "modules=[my_run_loops]"])
    assert cfg.modules == ["my_run_loops"] and "test-modules/mine" in AGENTS


def test_a_missing_recipe_module_names_the_key(cwd_module: Path) -> None:
    with pytest.raises(ConfigError, match="modules: 'no_such_loops': no module"):
        load_run_config(None, [*BASE, "modules=[no_such_loops]"])
