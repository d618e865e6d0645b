from __future__ import annotations

import pytest

from agentrl.errors import ConfigError, UnknownIdError
from trainers.config import DataConfig, EnvEntry, load_run_config

ENV = "data.envs=[{id: arith/Calculator-v0}]"


def test_defaults_with_an_env_validate() -> None:
    cfg = load_run_config(None, [ENV])
    assert cfg.rollout.group_size >= 2 and cfg.algo.adv_estimator == "grpo"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["train.batch_size=6", "train.mini_batch_size=4"], r"train.batch_size=8"),
        (["rollout.group_size=1"], "group_size must be >= 2"),
        (["train.steps=0"], "train.steps"),
        (["inference.backend=tgi"], "embedded, vllm, sglang"),
        (["inference.backend=vllm", "inference.weight_sync=tensors"], "auto, vllm, disk"),
        (["inference.engine=paged"], "inference.engine must be auto, static or dynamic"),
        (["inference.prefill_every=0"], "inference.prefill_every must be >= 1"),
        (["algo.loss_agg=token_mean"], "token-mean"),
        (["sft.prompt_loss_weight=-1"], r"sft.prompt_loss_weight must be >= 0"),
        (["sft.prompt_loss_weight=0.1", "engine.backend=megatron"], "engine.backend=torch"),
    ],
)
def test_bad_combinations_name_the_key_and_the_fix(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_run_config(None, [ENV, *overrides])


def test_no_env_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"data\.envs"):
        load_run_config(None, [])


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("algo.adv_estimator=grpoo", "grpo"),
        ("data.envs=[{id: arith/Calculater-v0}]", "arith/Calculator-v0"),
    ],
)
def test_unknown_names_suggest_the_close_one(override: str, suggestion: str) -> None:
    with pytest.raises(UnknownIdError, match=suggestion):
        load_run_config(None, [ENV, override])


def test_data_cursor_maps_to_fixed_samples() -> None:
    data = DataConfig(envs=[EnvEntry(id="a/A-v0"), EnvEntry(id="b/B-v0")], seed=10, num_seeds=2)
    samples = [data.sample(i) for i in range(6)]
    assert [(s.env_id, s.seed) for s in samples] == [
        ("a/A-v0", 10),
        ("b/B-v0", 10),
        ("a/A-v0", 11),
        ("b/B-v0", 11),
        ("a/A-v0", 10),
        ("b/B-v0", 10),
    ]
    assert data.sample(3) == data.sample(3)
    assert data.sample(0, eval=True).seed == data.eval_seed  # held out, never cycles


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ([], "ipc"),
        (["inference.weight_sync=disk"], "disk"),
        (["inference.backend=vllm"], "vllm"),
        (["inference.backend=vllm", "inference.weight_sync=disk"], "disk"),
        (["inference.backend=sglang"], "disk"),
    ],
)
def test_inference_backend_picks_its_weight_sync(overrides: list[str], path: str) -> None:
    assert load_run_config(None, [ENV, *overrides]).inference.sync_path() == path
