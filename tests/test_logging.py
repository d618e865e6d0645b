from __future__ import annotations

import json

import pytest

from agentrl.errors import ConfigError
from agentrl.logging import MetricsLogger, Timer, mean_metrics, read_jsonl


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
