from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import ConfigError
from agentrl.logging import MetricsLogger, Timer, WandbBackend, mean_metrics, read_jsonl
from tests import docblocks


def test_jsonl_and_tensorboard_receive_every_step(tmp_path) -> None:
    cfg = MetricsLogger.Config(console=True, jsonl=True, tensorboard=True)
    with MetricsLogger(cfg, tmp_path) as log:
        log.log({"train/pg_loss": 0.5, "rollout/reward_mean": 1.0}, step=1)
        log.log({"train/pg_loss": 0.25, "rollout/reward_mean": float("nan")}, step=2)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["train/pg_loss"] == 0.25
    assert rows[1]["rollout/reward_mean"] is None  # NaN is not valid JSON; stored as null
    assert any((tmp_path / "tb").iterdir())


def test_read_jsonl_merges_rows_of_a_step_later_values_winning(tmp_path) -> None:
    p = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "x/y": 1},
        {"step": 2, "x/y": 2},
        {"step": 2, "x/y": 3},
        {"step": 2, "e/v": 5},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    assert read_jsonl(p) == [{"step": 1, "x/y": 1}, {"step": 2, "x/y": 3, "e/v": 5}]


def test_keys_must_be_area_slash_name(tmp_path) -> None:
    with (
        MetricsLogger(MetricsLogger.Config(console=False), tmp_path) as log,
        pytest.raises(ConfigError, match="area/name"),
    ):
        log.log({"loss": 1.0}, step=0)


def test_non_zero_rank_writes_nothing(tmp_path) -> None:
    with MetricsLogger(MetricsLogger.Config(), tmp_path, rank=1) as log:
        log.log({"train/pg_loss": 1.0}, step=0)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_timer_accumulates_and_resets() -> None:
    t = Timer()
    with t.time("generate"):
        pass
    with t.time("generate"):
        pass
    out = t.pop()
    assert set(out) == {"timing/generate_s"} and out["timing/generate_s"] >= 0
    assert t.pop() == {}


def test_mean_metrics_averages_over_present_keys() -> None:
    assert mean_metrics([{"a/x": 1.0, "a/y": 4.0}, {"a/x": 3.0}]) == {"a/x": 2.0, "a/y": 4.0}


def test_progress_logs_lines_with_an_eta_when_stderr_is_not_a_terminal(caplog, monkeypatch) -> None:
    import io
    import logging
    import sys

    from agentrl.logging import progress

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, not a terminal
    with caplog.at_level(logging.INFO, logger="agentrl.logging"), progress("SFT", 20) as advance:
        for _ in range(20):
            advance()
    lines = [r.getMessage() for r in caplog.records if r.name == "agentrl.logging"]
    assert len(lines) == 10  # every 2 steps (a tenth), the last one included
    assert lines[0].startswith("SFT: 2/20 (10%), ") and "ETA " in lines[0]
    assert lines[-1].startswith("SFT: 20/20 (100%)") and lines[-1].endswith("ETA 0m00s")


# ------------------------------------------------------------------ Weights & Biases


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a ``run-<id>.wandb`` file (a LevelDB-style log W&B writes).

    Layout: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks,
    each ``crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last)``
    and its bytes; a block's tail shorter than a chunk header is zero padding.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # padding at the end of a block
            pos += block - pos % block
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zeros past the last record
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir: Path, *, want: int = 1) -> list[dict[str, Any]]:
    """Each history row W&B wrote offline under ``run_dir/wandb``: {"_step": k, key: value}.

    W&B's writer process can still be appending after ``finish()`` returns (seen once on a
    loaded 2-core machine: no history record yet), so the file is re-read for up to 10 s
    until it holds ``want`` rows."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    for _ in range(50):
        rows = [
            {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in wandb_records(log)
            if r.WhichOneof("record_type") == "history"
        ]
        if len(rows) >= want:
            break
        time.sleep(0.2)
    return rows


def test_wandb_offline_run_holds_every_logged_step(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    wandb_cfg = WandbBackend.Config(mode="offline", project="agentrl-tests", tags=["ci"])
    cfg = MetricsLogger.Config(console=False, wandb=wandb_cfg)
    with MetricsLogger(cfg, tmp_path / "demo", run_config={"seed": 3}) as log:
        log.log({"train/pg_loss": 0.5, "rollout/reward_mean": 0.25}, step=1)
        log.log({"train/pg_loss": 0.125, "rollout/reward_mean": float("nan")}, step=2)
    rows = wandb_history(tmp_path / "demo", want=2)
    assert [r["_step"] for r in rows] == [1, 2]
    assert rows[0]["train/pg_loss"] == 0.5 and rows[1]["train/pg_loss"] == 0.125
    assert rows[0]["rollout/reward_mean"] == 0.25
    assert read_jsonl(tmp_path / "demo" / "metrics.jsonl")[1]["train/pg_loss"] == 0.125
    (log_file,) = (tmp_path / "demo").glob("wandb/offline-run-*/run-*.wandb")
    (run,) = [r.run for r in wandb_records(log_file) if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.run_group, run.job_type) == (
        "agentrl-tests",
        "demo",
        "demo",
        "rl",
    )
    assert list(run.tags) == ["ci"]
    assert {i.key: json.loads(i.value_json) for i in run.config.update}["seed"] == 3


@pytest.mark.parametrize(
    ("wandb_cfg", "match"),
    [
        (
            WandbBackend.Config(mode="offlin", project="p"),
            "online, offline, disabled, got 'offlin'",
        ),
        (WandbBackend.Config(mode="offline"), r"logging\.wandb\.project=<name>"),
    ],
)
def test_wandb_config_errors_name_the_key_and_the_fix(tmp_path, wandb_cfg, match) -> None:
    with pytest.raises(ConfigError, match=match):
        MetricsLogger(MetricsLogger.Config(console=False, wandb=wandb_cfg), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_wandb_missing_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    cfg = MetricsLogger.Config(wandb=WandbBackend.Config(mode="online", project="p"))
    with pytest.raises(ConfigError, match=r"pip install wandb \(or pip install -e '\.\[wandb\]'\)"):
        MetricsLogger(cfg, tmp_path)


def test_wandb_online_without_a_login_is_a_config_error(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for var in ("HOME", "WANDB_CONFIG_DIR", "WANDB_DIR", "WANDB_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    cfg = MetricsLogger.Config(console=False, wandb=WandbBackend.Config(mode="online", project="p"))
    with pytest.raises(ConfigError, match=r"wandb login.*logging\.wandb\.mode=offline"):
        MetricsLogger(cfg, tmp_path / "run")


def test_run_config_takes_wandb_overrides_and_validates_them() -> None:
    from trainers.config import load_run_config

    env = "data.envs=[{id: arith/Calculator-v0}]"
    ok = load_run_config(None, [env, "logging.wandb.mode=offline", "logging.wandb.project=x"])
    ok.validate()
    assert (ok.logging.wandb.mode, ok.logging.wandb.project) == ("offline", "x")
    assert load_run_config(None, [env]).logging.wandb.mode == "disabled"  # off by default
    with pytest.raises(ConfigError, match=r"logging\.wandb\.project"):
        load_run_config(None, [env, "logging.wandb.mode=online"]).validate()


# ------------------------------------------------------------------ docs/guides/logging.md


def test_logging_guide_examples_run(tmp_path) -> None:
    """The guide's Python blocks, in a fresh interpreter; W&B's own files stay in tmp_path."""
    env = {f"WANDB_{k}_DIR": str(tmp_path / k.lower()) for k in ("CONFIG", "CACHE", "DATA")}
    blocks = docblocks.runnable("docs/guides/logging.md", "python")
    done = docblocks.run_python(blocks, cwd=tmp_path, env=env, timeout_s=180)
    assert "/wandb/offline-run-" in done.stdout


def test_logging_guide_recipe_fragment_loads_and_turns_wandb_on(tmp_path) -> None:
    from trainers.config import load_run_config

    (fragment,) = docblocks.blocks("docs/guides/logging.md", "yaml")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(fragment.code)
    cfg = load_run_config(recipe, ["data.envs=[{id: arith/Calculator-v0}]"]).logging.wandb
    assert (cfg.mode, cfg.project, cfg.tags) == ("offline", "agentrl", ["quickstart"])
