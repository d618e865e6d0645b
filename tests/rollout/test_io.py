"""Trajectories and groups round-trip through JSONL and parquet unchanged."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from agentrl.errors import ConfigError
from agentrl.rollout.io import load_groups, load_trajectories, save_groups, save_trajectories
from agentrl.types import (
    Message,
    RolloutStatus,
    Sample,
    Segment,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
    Turn,
)


def make_traj(
    uid: str, reward: float, status: RolloutStatus = RolloutStatus.COMPLETED
) -> Trajectory:
    seg = Segment()
    seg.extend_prompt([1, 2, 3])
    seg.extend_generated([7, 8], [-0.125, -1.0000001], 3)
    seg2 = Segment()
    seg2.extend_prompt([4])
    seg2.extend_generated([9], [-2.5], [4])
    return Trajectory(
        sample=Sample(
            env_id="ns/Env-v0", env_kwargs={"n": [1, 2]}, seed=3, uid=uid, extra={"answer": "é"}
        ),
        messages=[
            Message(role="user", content="hi"),
            Message(
                role="assistant",
                content="",
                tool_calls=(ToolCall(name="calc", arguments={"x": "1+1"}, id="call_1"),),
            ),
            Message(role="tool", content="2", tool_call_id="call_1", name="calc"),
            Message(
                role="user",
                content=[
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                ],
            ),
        ],
        segments=[seg, seg2],
        report={"FAIL_TO_PASS": {"t.py::t": "passed"}, "resolved": True},
        turns=[
            Turn(
                prompt_len=3,
                completion_ids=[7, 8],
                completion_logprobs=[-0.125, -1.0000001],
                finish_reason="stop",
                weight_version=3,
                llm_time_s=0.5,
                env_time_s=0.25,
            )
        ],
        reward=reward,
        reward_components={"correct": reward},
        status=status,
        error=None if status is RolloutStatus.COMPLETED else "EnvError: boom",
        metrics={"tool_calls": 1.0},
        llm_time_s=0.5,
        env_time_s=0.25,
        wall_time_s=1.0,
    )


def groups() -> list[TrajectoryGroup]:
    failed = Trajectory(
        sample=Sample(env_id="ns/Env-v0", uid="b"), status=RolloutStatus.ERROR_ENV, error="x"
    )
    return [
        TrajectoryGroup(
            uid="a",
            trajectories=[make_traj("a", 1.0), make_traj("a", 0.0, RolloutStatus.TRUNCATED_LENGTH)],
        ),
        TrajectoryGroup(uid="b", trajectories=[failed, make_traj("b", 0.5)]),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_trajectories_round_trip(tmp_path, suffix) -> None:  # type: ignore[no-untyped-def]
    trajs = [t for g in groups() for t in g.trajectories]
    path = save_trajectories(tmp_path / f"t{suffix}", trajs)
    assert load_trajectories(path) == trajs


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_groups_round_trip(tmp_path, suffix) -> None:  # type: ignore[no-untyped-def]
    gs = groups()
    path = save_groups(tmp_path / "sub" / f"g{suffix}", gs)
    assert load_groups(path) == gs


def test_parquet_ledger_is_nested_columns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = save_trajectories(tmp_path / "t.parquet", [make_traj("a", 1.0)])
    table = pq.read_table(path)
    assert table.column("segments_token_ids").to_pylist() == [[[1, 2, 3, 7, 8], [4, 9]]]
    assert table.column("segments_loss_mask").to_pylist() == [[[0, 0, 0, 1, 1], [0, 1]]]
    assert table.column("status").to_pylist() == ["completed"]


def test_unknown_format(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"\.jsonl or \.parquet"):
        save_trajectories(tmp_path / "t.csv", [])


def test_files_from_before_the_report_column_still_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    path = save_trajectories(tmp_path / "t.parquet", [make_traj("a", 1.0)])
    pq.write_table(pq.read_table(path).drop_columns(["report"]), path)
    [old] = load_trajectories(path)
    assert old.report == {} and old.reward == 1.0
