from __future__ import annotations

from dataclasses import dataclass, field

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
