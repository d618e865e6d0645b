"""`agentrl eval` with --server, --k, --tasks and --out: pass@k, per-task rows, predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.errors import AgentRLError
from agentrl.inference.launch import ServerProcess
from agentrl.types import Message, RolloutStatus, Sample, Trajectory
from trainers.cli import eval_main
from trainers.eval import pass_at_k, per_instance, swe_bench_predictions

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SMALL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "rollout.max_new_tokens=8",
    "rollout.max_turns=2",
    "eval.num_samples=3",
    "logging.console=false",
]


@pytest.mark.parametrize(
    ("n", "c", "k", "want"),
    [(5, 1, 1, 0.2), (5, 0, 3, 0.0), (5, 5, 3, 1.0), (10, 3, 5, 1 - 21 / 252), (4, 2, 3, 1.0)],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, want: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(want)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)


def traj(iid: str, reward: float, patch: str | None = None) -> Trajectory:
    report = {"instance_id": iid, **({"model_patch": patch} if patch is not None else {})}
    return Trajectory(
        sample=Sample(env_id="swe/Repo-v0"),
        messages=[
            Message(role="system", content="same for all"),
            Message(role="user", content=iid),
        ],
        reward=reward,
        metrics={"success": float(reward == 1.0)},
        report=report,
    )


def test_per_instance_rows_and_swe_bench_predictions() -> None:
    trajs = [traj("a", 1.0, "diff a1"), traj("a", 0.0, "diff a2"), traj("b", 0.0, "")]
    rows = {r["task"]: r for r in per_instance(trajs, k=2)}
    assert rows["a"]["n"] == 2 and rows["a"]["passed"] == 1 and rows["a"]["pass@2"] == 1.0
    assert rows["b"]["pass@1"] == 0.0 and rows["a"]["statuses"] == [RolloutStatus.COMPLETED.value]
    preds = swe_bench_predictions(trajs, "tiny")
    assert preds == [
        {"instance_id": "a", "model_name_or_path": "tiny", "model_patch": "diff a1"},
        {"instance_id": "b", "model_name_or_path": "tiny", "model_patch": ""},
    ]


def test_eval_against_a_running_server_with_k_samples(tmp_path: Path) -> None:
    from agentrl.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model", hidden_size=32, num_layers=1)
    with ServerProcess(ServerProcess.Config(model=str(model), num_threads=1)) as server:
        result = eval_main(RECIPE, model, SMALL, servers=[server.url], k=2, out=tmp_path / "out")
    assert result["eval/n"] == 6.0 and result["eval/num_tasks"] == 3.0
    assert 0.0 <= result["eval/pass@1"] <= result["eval/pass@2"] <= 1.0
    rows = [
        json.loads(line)
        for line in (tmp_path / "out" / "per_instance.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 3 and all(r["n"] == 2 for r in rows)
    assert len((tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()) == 6
    assert not (tmp_path / "out" / "predictions.jsonl").exists()  # no grader patches here


def test_eval_refuses_a_missing_task_file(tmp_path: Path) -> None:
    with pytest.raises(AgentRLError, match=r"--tasks .* is not a file"):
        eval_main(RECIPE, tmp_path, SMALL, tasks=tmp_path / "nope.jsonl")
