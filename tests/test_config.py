from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from agentrl.config import load_config, to_yaml
from agentrl.errors import ConfigError


@dataclass
class _Rollout:
    group_size: int = 4
    temperature: float = 1.0


@dataclass
class _Run:
    rollout: _Rollout = field(default_factory=_Rollout)
    steps: int = 10

    def validate(self) -> None:
        if self.steps <= 0:
            raise ConfigError(f"steps ({self.steps}) must be positive")


def test_yaml_then_overrides(tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  group_size: 8\nsteps: 3\n")
    cfg = load_config(_Run, recipe, ["rollout.temperature=0.5"])
    assert cfg == _Run(rollout=_Rollout(group_size=8, temperature=0.5), steps=3)
    assert "group_size: 8" in to_yaml(cfg)


def test_unknown_key_names_the_key_and_suggests() -> None:
    with pytest.raises(
        ConfigError, match=r"'rollout.grop_size'.*Did you mean 'rollout.group_size'"
    ):
        load_config(_Run, overrides=["rollout.grop_size=8"])


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(_Run, overrides=["rollout.group_size=many"])


def test_validate_runs_and_missing_file_is_clear(tmp_path) -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        load_config(_Run, overrides=["steps=0"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(_Run, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(_Run, overrides=["steps"])


@dataclass
class _Entry:
    id: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _WithList:
    envs: list[_Entry] = field(default_factory=list)
    steps: int = 1


def test_an_override_indexes_a_list_entry_in_order(tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("envs:\n  - {id: a, kwargs: {n: 1, m: 2}}\n  - {id: b}\n")
    cfg = load_config(_WithList, recipe, ["envs.0.kwargs.n=5", "envs.1.id=c", "steps=2"])
    assert cfg.envs == [_Entry("a", {"n": 5, "m": 2}), _Entry("c", {})] and cfg.steps == 2
    # Overrides apply in order: a whole list given later replaces the indexed change.
    cfg = load_config(_WithList, recipe, ["envs.0.kwargs.n=5", "envs=[{id: z}]"])
    assert cfg.envs == [_Entry("z", {})]
    with pytest.raises(ConfigError, match=r"envs\[2\] cannot be set \(it has 2 entries"):
        load_config(_WithList, recipe, ["envs.2.id=x"])
