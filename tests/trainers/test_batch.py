"""TrainBatch: trajectories -> token-aligned tensors, masking, split/concat, packing."""

from __future__ import annotations

import pickle

import pytest
import torch

from agentrl.batch import TrainBatch
from agentrl.errors import ConfigError, TokenizationError
from agentrl.types import RolloutStatus, Sample, Segment, Trajectory, TrajectoryGroup

PAD = 0


def seg(
    prompt: list[int], gen: list[int], *more: tuple[list[int], list[int]], version: int = 3
) -> Segment:
    """A ledger: prompt tokens, generated tokens (logprob -0.1 * id), then more (env, gen) pairs."""
    s = Segment()
    s.extend_prompt(prompt)
    s.extend_generated(gen, [-0.1 * t for t in gen], version)
    for env, g in more:
        s.extend_prompt(env)
        s.extend_generated(g, [-0.1 * t for t in g], version + 1)
    return s


def traj(
    *segments: Segment, reward: float = 1.0, status: RolloutStatus = RolloutStatus.COMPLETED
) -> Trajectory:
    return Trajectory(
        sample=Sample(env_id="x"), segments=list(segments), reward=reward, status=status
    )


def group(uid: str, *trajs: Trajectory) -> TrajectoryGroup:
    return TrajectoryGroup(uid=uid, trajectories=list(trajs))


@pytest.fixture
def groups() -> list[TrajectoryGroup]:
    return [
        group(
            "g0", traj(seg([5, 6, 7], [8, 9]), reward=1.0), traj(seg([5, 6, 7], [10]), reward=0.0)
        ),
        group(
            "g1",
            traj(seg([11], [12, 13], ([14, 15], [16])), reward=0.5),
            traj(seg([11], [17, 18, 19, 20]), reward=-1.0),
        ),
    ]


def test_shapes_and_padding(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    assert len(b) == 4 and b.seq_len == 6
    for name in (
        "input_ids",
        "attention_mask",
        "position_ids",
        "loss_mask",
        "rollout_logprobs",
        "versions",
        "token_rewards",
    ):
        assert b[name].shape == (4, 6), name
    for name in ("rewards", "group_ids", "sample_mask", "seq_lens"):
        assert b[name].shape == (4,), name
    assert b.input_ids[1].tolist() == [5, 6, 7, 10, PAD, PAD]
    assert b.attention_mask[1].tolist() == [1, 1, 1, 1, 0, 0]
    assert b.position_ids[1].tolist() == [0, 1, 2, 3, 0, 0]
    assert b.versions[1].tolist() == [-1, -1, -1, 3, -1, -1]
    assert b.seq_lens.tolist() == [5, 4, 6, 5]
    assert b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.num_tokens == 20
    assert TrainBatch.from_groups(groups, PAD, pad_to_multiple_of=4).seq_len == 8


def test_token_alignment(groups: list[TrajectoryGroup]) -> None:
    """loss_mask[t] and rollout_logprobs[t] describe token t; column 0 never has a loss."""
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    row = 2  # [11] [12 13] [14 15] [16]
    assert b.input_ids[row].tolist() == [11, 12, 13, 14, 15, 16]
    assert b.loss_mask[row].tolist() == [0, 1, 1, 0, 0, 1]
    lp = b.rollout_logprobs[row]
    for t in range(6):
        expected = -0.1 * int(b.input_ids[row, t]) if b.loss_mask[row, t] else 0.0
        assert lp[t].item() == pytest.approx(expected)
    assert b.versions[row].tolist() == [-1, 3, 3, -1, -1, 4]
    # a ledger whose first token is generated: position 0 is still masked (no logprob exists)
    only_gen = TrainBatch.from_groups([group("g", traj(seg([], [4, 5])))], PAD)
    assert only_gen.loss_mask[0].tolist() == [0, 1]


def test_rewards_at_last_generated_token(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    assert b.rewards.tolist() == [1.0, 0.0, 0.5, -1.0]
    assert b.token_rewards[0].tolist() == [0, 0, 0, 0, 1.0, 0]
    assert b.token_rewards[2].tolist() == [0, 0, 0, 0, 0, 0.5]
    assert torch.allclose(b.token_rewards.sum(1), b.rewards)


def test_multi_segment_rows_share_group_and_reward() -> None:
    t = traj(seg([1], [2, 3]), seg([1, 2, 3, 4], [5]), reward=2.0)
    other = traj(seg([1], [6]), reward=0.0)
    b = TrainBatch.from_groups([group("g", t, other)], PAD)
    assert len(b) == 3
    assert [r.segment_index for r in b.rows] == [0, 1, 0]
    assert [r.num_segments for r in b.rows] == [2, 2, 1]
    assert b.rows[0].trajectory_id == b.rows[1].trajectory_id == t.id
    assert b.group_ids.tolist() == [0, 0, 0]
    assert b.rewards.tolist() == [2.0, 2.0, 0.0]
    last = TrainBatch.from_groups([group("g", t, other)], PAD, segment_reward="last")
    assert last.rewards.tolist() == [0.0, 2.0, 0.0]


def test_infra_failures_are_masked(groups: list[TrajectoryGroup]) -> None:
    groups[1].trajectories[1].status = RolloutStatus.ERROR_SANDBOX
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    assert b.sample_mask.tolist() == [1.0, 1.0, 0.0, 0.0]  # the whole group: its baseline is wrong
    assert b.loss_mask[2:].sum() == 0 and b.loss_mask[:2].sum() > 0
    assert b.rows[3].status == RolloutStatus.ERROR_SANDBOX
    keep = TrainBatch.from_groups(groups, pad_token_id=PAD, mask_failed_groups=False)
    assert keep.sample_mask.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert keep.loss_mask[3].sum() == 0 and keep.loss_mask[2].sum() == 3


def test_bad_input_is_explained() -> None:
    broken = Segment(token_ids=[1, 2], loss_mask=[0], logprobs=[0.0, 0.0], versions=[-1, -1])
    with pytest.raises(TokenizationError, match="loss_mask"):
        TrainBatch.from_groups([group("g", traj(broken))], PAD)
    with pytest.raises(ConfigError, match="no segment"):
        TrainBatch.from_groups([group("g", traj())], PAD)


def _assert_equal(a: TrainBatch, b: TrainBatch) -> None:
    assert a.rows == b.rows
    assert set(a.td.keys()) == set(b.td.keys())
    for k in map(str, a.td.keys()):
        assert torch.equal(a[k], b[k]), k


def test_split_concat_round_trip(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups + groups[:1], pad_token_id=PAD)
    b["advantages"] = torch.randn(len(b), b.seq_len) * b.attention_mask  # 0 at padding
    for n in (1, 2, 3, len(b)):
        parts = b.split(n)
        assert len(parts) == n and all(len(p) for p in parts)
        _assert_equal(TrainBatch.concat(parts), b)
    with pytest.raises(ConfigError):
        b.split(len(b) + 1)


def test_split_balances_tokens_and_trims_padding() -> None:
    lens = [30, 2, 2, 2, 2, 2, 2, 2, 2, 10, 10, 10]
    b = TrainBatch.from_groups([group("g", *[traj(seg([1], [2] * (n - 1))) for n in lens])], PAD)
    parts = b.split(3)
    assert [p.num_tokens for p in parts] == [30, 26, 20]
    assert [p.seq_len for p in parts] == [30, 10, 10]  # padding trimmed per part
    assert [len(p) for p in parts] == [1, 9, 2]
    assert [p.num_tokens for p in b.split(3)] == [30, 26, 20]  # deterministic


def test_group_ids_stay_dense_and_follow_groups(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    tail = b.select([3, 2, 1])
    assert tail.group_ids.tolist() == [0, 0, 1]
    again = TrainBatch.concat([b.select([0]), b.select([2, 1])])
    assert again.group_ids.tolist() == [0, 1, 0]  # row 1 rejoins row 0's group


def test_micro_batches(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)  # seq lens 5, 4, 6, 5
    assert [len(m) for m in b.micro_batches(size=3)] == [3, 1]
    assert [m.num_tokens for m in b.micro_batches(max_tokens=10)] == [9, 6, 5]
    assert [m.num_tokens for m in b.micro_batches(max_tokens=1)] == [5, 4, 6, 5]
    assert len(b.micro_batches(num=2)) == 2
    with pytest.raises(ConfigError):
        b.micro_batches(size=2, num=2)


def test_packed_layout(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    p = b.pack()
    assert p.input_ids.shape == (1, b.num_tokens)
    assert p.cu_seqlens.tolist() == [0, 5, 9, 15, 20]
    assert p.max_seqlen == 6
    assert p.position_ids[0, 5:9].tolist() == [0, 1, 2, 3]  # restart per sequence
    assert p.input_ids[0, 9:15].tolist() == [11, 12, 13, 14, 15, 16]
    assert torch.equal(p.unpack(p.pack(b.loss_mask)), b.loss_mask)
    assert torch.equal(p.unpack(p.input_ids, fill=PAD), b.input_ids)


def test_fields_to_and_pickle(groups: list[TrajectoryGroup]) -> None:
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"\(B,\) or \(B, T"):
        b["advantages"] = torch.zeros(len(b), b.seq_len + 1)
    with pytest.raises(KeyError, match="no field"):
        b["nope"]
    _assert_equal(pickle.loads(pickle.dumps(b)), b)
    _assert_equal(b.to("cpu"), b)
    assert "input_ids" in b and "B=4" in repr(b)
