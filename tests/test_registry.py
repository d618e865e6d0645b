"""Registries: lazy "module:attr" entry points, the entry-point group, duplicates, did-you-mean."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.env import ENVS, Env, make_env, register_env
from agentrl.errors import DuplicateIdError, UnknownEnvError, UnknownIdError
from agentrl.registry import Registry
from agentrl.tool import TOOLS, get_tool, register_tool, tool
from agentrl.tool_parsers import get_tool_parser

PLUGIN_ENV = """
from agentrl.env import Env
from agentrl.types import Message


class PluginEnv(Env):
    def __init__(self, greeting: str = "hi") -> None:
        self.greeting = greeting

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [Message(role="user", content=self.greeting)], {}

    def step(self, action):
        return [], 1.0, True, False, {}
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module `lazy_plugin_mod` plus a dist-info that declares it under agentrl.envs."""
    (tmp_path / "lazy_plugin_mod.py").write_text(PLUGIN_ENV)
    dist = tmp_path / "lazy_plugin_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lazy-plugin-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[agentrl.envs]\nplugin/Hello-v0 = lazy_plugin_mod:PluginEnv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_plugin_mod", raising=False)
    return tmp_path


def test_string_entry_point_is_imported_only_when_made(plugin_dir: Path) -> None:
    register_env("test-registry/Lazy-v0", "lazy_plugin_mod:PluginEnv", greeting="hey")
    try:
        assert "lazy_plugin_mod" not in sys.modules
        assert "test-registry/Lazy-v0" in ENVS
        assert "lazy_plugin_mod" not in sys.modules
        env = make_env("test-registry/Lazy-v0")
        assert "lazy_plugin_mod" in sys.modules
        assert env.reset(seed=0)[0][0].content == "hey"
        assert make_env("test-registry/Lazy-v0", greeting="yo").reset()[0][0].content == "yo"
    finally:
        ENVS.unregister("test-registry/Lazy-v0")


def test_entry_point_group_from_an_installed_distribution(plugin_dir: Path) -> None:
    reg: Registry[Env] = Registry(
        "env", entry_point_group="agentrl.envs", error_cls=UnknownEnvError
    )
    assert "plugin/Hello-v0" in reg.ids()
    assert "lazy_plugin_mod" not in sys.modules  # listed, not imported
    env = reg.make("plugin/Hello-v0", greeting="hello")
    assert env.reset(seed=1)[0][0].content == "hello"


def test_importing_envs_is_cheap() -> None:
    code = textwrap.dedent(
        """
        import sys, envs
        from agentrl.env import ENVS
        ids = ENVS.ids()
        heavy = [m for m in sys.modules if m.startswith("envs.") or m in ("reasoning_gym", "torch")]
        print(len(ids), ",".join(heavy))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n, heavy = (
        out.stdout.strip().split(" ", 1) if " " in out.stdout.strip() else (out.stdout.strip(), "")
    )
    assert int(n) >= 7
    assert heavy == ""


def test_duplicate_id_is_an_error_but_reregistering_the_same_is_not() -> None:
    register_env("test-registry/Dup-v0", "envs.guess:GuessNumberEnv", high=8)
    try:
        register_env("test-registry/Dup-v0", "envs.guess:GuessNumberEnv", high=8)  # harmless
        with pytest.raises(DuplicateIdError, match="already registered"):
            register_env("test-registry/Dup-v0", "envs.countdown:CalculatorEnv")
        with pytest.raises(DuplicateIdError):
            register_env("test-registry/Dup-v0", "envs.guess:GuessNumberEnv", high=9)
    finally:
        ENVS.unregister("test-registry/Dup-v0")


def test_unknown_env_suggests_close_ids() -> None:
    with pytest.raises(UnknownEnvError) as exc:
        make_env("games/GuessNumber-v1")
    assert "Did you mean 'games/GuessNumber-v0'" in str(exc.value)
    assert exc.value.suggestions[0] == "games/GuessNumber-v0"
    assert "agentrl envs list" in str(exc.value)


def test_tool_registry_and_parser_registry() -> None:
    @tool
    def shout(text: str) -> str:
        """Upper-case text."""
        return text.upper()

    register_tool(shout)
    try:
        assert get_tool("shout") is shout
        with pytest.raises(UnknownIdError, match="Did you mean 'shout'"):
            get_tool("shoutt")
        with pytest.raises(DuplicateIdError):
            register_tool(tool(name="shout")(lambda text: text))
    finally:
        TOOLS.unregister("shout")
    with pytest.raises(UnknownIdError, match="Did you mean 'hermes'"):
        get_tool_parser("hermez")
