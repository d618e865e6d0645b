"""Registries: lazy "module:attr" entry points, the entry-point group, duplicates, did-you-mean."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.env import ENVS, Env, make_env, register_env
from agentrl.errors import ConfigError, DuplicateIdError, UnknownEnvError, UnknownIdError
from agentrl.registry import Registry, import_modules
from agentrl.tool import TOOLS, get_tool, register_tool, tool
from agentrl.tool_parsers import get_tool_parser

PLUGIN_ENV = """
from agentrl.env import Env
from agentrl.types import Message


class PluginEnv(Env):
    def __init__(self, greeting: str = "hi") -> None:
        self.greeting = greeting

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        return [Message(role="user", content=self.greeting)], {}

    async def astep(self, action):
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
        with pytest.raises(DuplicateIdError, match="registered twice with different targets"):
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


SELF_REGISTERING = """
from selfreg_registry import REG


class Thing:
    def __init__(self, size: int = 1) -> None:
        self.size = size


REG.register("thing-a", Thing, size=3)
"""


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """Modules selfreg_registry (a Registry), selfreg_mod (registers Thing in code at import)
    and selfreg_other (another class), plus a dist-info declaring ``thing-a = target``."""
    (tmp_path / "selfreg_registry.py").write_text(
        "from agentrl.registry import Registry\nREG = Registry('thing', entry_point_group='agentrl.selfreg')\n"
    )
    (tmp_path / "selfreg_mod.py").write_text(SELF_REGISTERING)
    (tmp_path / "selfreg_other.py").write_text("class Other:\n    pass\n")
    dist = tmp_path / "selfreg_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: selfreg-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[agentrl.selfreg]\nthing-a = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in ("selfreg_registry", "selfreg_mod", "selfreg_other"):
        monkeypatch.delitem(sys.modules, mod, raising=False)


def test_entry_point_and_code_registration_of_the_same_target_are_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "selfreg_mod:Thing")
    from selfreg_registry import REG  # type: ignore[import-not-found]

    thing = REG.make("thing-a")  # loads the entry point, whose module registers in code
    assert thing.size == 3  # the code registration's defaults apply from the first make
    assert REG.make("thing-a", size=5).size == 5
    assert REG.ids() == ["thing-a"]


def test_code_registration_first_then_the_same_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "selfreg_mod:Thing")
    import selfreg_mod  # type: ignore[import-not-found]

    assert selfreg_mod.REG.ids() == ["thing-a"]
    assert selfreg_mod.REG.make("thing-a").size == 3


def test_entry_point_and_code_with_different_targets_fail_clearly_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "selfreg_other:Other")
    import selfreg_mod  # type: ignore[import-not-found]

    for _ in range(2):  # never half-loaded: every later lookup says the same
        with pytest.raises(DuplicateIdError) as exc:
            selfreg_mod.REG.make("thing-a")
        msg = str(exc.value)
        assert "'thing-a' is registered twice" in msg
        assert "selfreg_mod:Thing (code)" in msg
        assert "selfreg_other:Other (entry point of selfreg-dist)" in msg


def test_entry_point_loaded_first_then_code_with_another_target_fails_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "selfreg_other:Other")
    from selfreg_registry import REG  # type: ignore[import-not-found]

    assert REG.ids() == ["thing-a"]
    with pytest.raises(DuplicateIdError, match="selfreg_other:Other"):
        import selfreg_mod  # type: ignore[import-not-found]  # noqa: F401


def test_import_modules_finds_the_current_directory_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd_mod_a.py").write_text("X = 1\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "file_mod_b.py").write_text("X = 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for mod in ("cwd_mod_a", "file_mod_b"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    import_modules(["cwd_mod_a", "sub/file_mod_b.py"])
    assert sys.modules["cwd_mod_a"].X == 1 and sys.modules["file_mod_b"].X == 2
    with pytest.raises(
        ConfigError, match=r"--module 'nope_mod': no module 'nope_mod' in the current"
    ):
        import_modules(["nope_mod"])
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    with pytest.raises(ConfigError, match="'not_installed_dep_xyz' is missing"):
        import_modules(["needs_dep"], key="modules:")
