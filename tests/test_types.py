from __future__ import annotations

import json

import pytest

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


def _trajectory(status: RolloutStatus = RolloutStatus.COMPLETED) -> Trajectory:
    seg = Segment()
    seg.extend_prompt([1, 2, 3])
    seg.extend_generated([4, 5], [-0.5, -0.25], version=3)
    seg.extend_prompt([6])
    seg.extend_generated([7], [-1.0], version=[4])
    call = ToolCall(name="calculator", arguments={"expression": "1+1"}, id="call_1")
    return Trajectory(
        sample=Sample(env_id="arith/Countdown-v0", env_kwargs={"n": 3}, seed=7, uid="u1"),
        messages=[
            Message(role="user", content="hi"),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content="2", tool_call_id="call_1"),
        ],
        segments=[seg],
        turns=[
            Turn(
                prompt_len=3,
                completion_ids=[4, 5],
                completion_logprobs=[-0.5, -0.25],
                finish_reason="stop",
                weight_version=3,
            )
        ],
        reward=1.0,
        status=status,
    )


def test_segment_ledger_keeps_lists_aligned() -> None:
    seg = _trajectory().segments[0]
    seg.validate()
    assert seg.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert seg.versions == [-1, -1, -1, 3, 3, -1, 4]
    assert seg.logprobs[3:5] == [-0.5, -0.25]
    assert seg.prompt_len == 3
    assert seg.num_generated == 3


def test_segment_rejects_misaligned_generated_tokens() -> None:
    with pytest.raises(ValueError, match="2 generated ids but 1 logprobs"):
        Segment().extend_generated([1, 2], [-0.1], version=0)


def test_trajectory_round_trips_through_json() -> None:
    t = _trajectory()
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t
    group = TrajectoryGroup(uid="u1", trajectories=[t, _trajectory()])
    assert TrajectoryGroup.from_dict(json.loads(json.dumps(group.to_dict()))) == group


def test_tool_call_arguments_accept_json_strings() -> None:
    tc = ToolCall.from_openai({"id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}})
    assert tc.arguments == {"x": 1}


def test_infra_failures_are_not_trainable_and_mask_the_group() -> None:
    ok, bad = _trajectory(), _trajectory(RolloutStatus.ERROR_INFERENCE)
    assert ok.trainable and not bad.trainable
    assert not TrajectoryGroup(uid="u", trajectories=[ok, bad]).trainable
    # Agent failures are data: truncated rollouts are still trained on.
    assert _trajectory(RolloutStatus.TRUNCATED_MAX_TURNS).trainable
