"""Choosing the training engine with one key: engine.backend (and megatron.* for its layout)."""

import pytest

from agentrl.errors import ConfigError, UnknownIdError
from trainers.config import load_run_config
from trainers.workers import build_engine

RECIPE = "recipes/quickstart.yaml"


def test_megatron_backend_and_layout_come_from_the_recipe_overrides() -> None:
    cfg = load_run_config(
        RECIPE,
        ["engine.backend=megatron", "train.world_size=4", "megatron.tensor_parallel_size=2"],
    )
    assert cfg.engine.backend == "megatron"
    assert cfg.megatron.tensor_parallel_size == 2 and cfg.train.world_size == 4


def test_a_misspelt_backend_gets_a_suggestion() -> None:
    with pytest.raises(UnknownIdError, match="megatron"):
        load_run_config(RECIPE, ["engine.backend=megatorn"])


def test_world_size_must_hold_whole_model_parallel_groups() -> None:
    with pytest.raises(ConfigError, match=r"multiple of megatron.tensor_parallel_size"):
        load_run_config(
            RECIPE,
            ["engine.backend=megatron", "train.world_size=3", "megatron.tensor_parallel_size=2"],
        )


def test_build_engine_makes_the_named_backend(tmp_path) -> None:
    from agentrl.engine import EngineConfig
    from trainers.engines.megatron.engine import MegatronEngine
    from trainers.engines.torch_native import TorchEngine

    cfg = EngineConfig(model_path=str(tmp_path), backend="megatron", role="ref", device="cpu")
    assert isinstance(build_engine(cfg), MegatronEngine)  # built, not initialised
    assert isinstance(build_engine(EngineConfig(model_path=str(tmp_path))), TorchEngine)


def test_each_engine_gets_its_own_section_through_the_registry(tmp_path) -> None:
    """The run config hands a backend its own section; generic code never names the backend."""
    import ast
    from pathlib import Path

    from agentrl.engine import EngineConfig

    cfg = load_run_config(
        RECIPE, ["engine.backend=megatron", "train.world_size=2", "megatron.tensor_parallel_size=2"]
    )
    options = cfg.engine_options("megatron")
    assert options is cfg.megatron and cfg.engine_options("torch") is None
    engine = build_engine(
        EngineConfig(model_path=str(tmp_path), backend="megatron", role="ref", device="cpu"),
        options,
    )
    assert engine.parallel.tensor_parallel_size == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="takes no options"):
        build_engine(EngineConfig(model_path=str(tmp_path)), options)

    root = Path(__file__).resolve().parents[2]
    for generic in ("trainers/driver.py", "trainers/sft.py", "trainers/workers.py"):
        strings = {
            n.value
            for n in ast.walk(ast.parse((root / generic).read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        names = {
            n.id
            for n in ast.walk(ast.parse((root / generic).read_text()))
            if isinstance(n, ast.Name)
        }
        assert "megatron" not in strings and "MegatronConfig" not in names, generic
