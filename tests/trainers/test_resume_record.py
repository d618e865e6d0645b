"""A resumed run keeps the record of an uninterrupted one: summary, metrics rows and plot.

One run goes straight through; a second stops after its first checkpointed step (as a crash
would) and is resumed; the finished straight run is then resumed once more. The "before" eval
is stored at step 0 and reused, no eval row is written twice, and both summaries agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_driver import ray_local, smoke_config  # noqa: F401  (ray_local is a fixture)

from agentrl.logging import read_jsonl
from trainers.driver import Trainer

_SAME = ("steps", "eval_before", "eval_after", "train_reward_first", "train_reward_last")


def _record(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's reproducible part, flat (evals as eval_before/success_rate, ...)."""
    out: dict[str, Any] = {}
    for k in _SAME:
        v = summary[k]
        out |= {f"{k}/{m}": x for m, x in v.items()} if isinstance(v, dict) else {k: v}
    return out


def _eval_rows(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [int(r.split('"step": ')[1].split(",")[0]) for r in lines if '"eval/reward_mean"' in r]


def test_resume_keeps_the_record_of_an_uninterrupted_run(
    tmp_path: Path,
    ray_local: None,  # noqa: F811
) -> None:
    straight = Trainer(smoke_config(tmp_path, "name=straight"), command="straight").run()

    stopped = Trainer(smoke_config(tmp_path, "name=stopped"))
    try:  # the first step and its checkpoint, then the process "dies"
        stopped.setup()
        stopped.evaluate_once("before", step=0)
        stopped.step()
    finally:
        stopped.close()
    resumed = Trainer(smoke_config(tmp_path, "name=stopped"), resume=True).run()

    assert resumed["eval_before"] is not None and resumed["eval_after"] is not None
    assert _record(resumed) == pytest.approx(_record(straight), rel=1e-5, abs=1e-6)
    for name in ("straight", "stopped"):
        run_dir = tmp_path / name
        assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
        assert _eval_rows(run_dir) == [0, 2]  # one "before" row, one "after" row
        assert (run_dir / "reward_curve.png").is_file()

    # A finished run resumed again: nothing re-evaluated, nothing appended, same summary.
    rows = (tmp_path / "straight" / "metrics.jsonl").read_text()
    again = Trainer(smoke_config(tmp_path, "name=straight"), resume=True).run()
    assert (tmp_path / "straight" / "metrics.jsonl").read_text() == rows
    assert _record(again) == _record(straight)
