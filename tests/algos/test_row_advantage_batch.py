"""TrainBatch keeps per-row (B, 1) fields through select, split, micro_batches, concat, pickle."""

from __future__ import annotations

import pickle

import pytest
import torch

from agentrl.algos import ADV_ESTIMATORS, AdvantageConfig, AdvantageInputs, token_level
from agentrl.batch import TrainBatch
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup

PAD = 0


def _traj(n_prompt: int, n_gen: int, reward: float) -> Trajectory:
    s = Segment()
    s.extend_prompt(list(range(10, 10 + n_prompt)))
    s.extend_generated(list(range(50, 50 + n_gen)), [-1.0] * n_gen, 0)
    return Trajectory(sample=Sample(env_id="x"), segments=[s], reward=reward)


def _batch() -> TrainBatch:
    groups = [
        TrajectoryGroup(uid="a", trajectories=[_traj(3, 9, 1.0), _traj(3, 2, 0.0)]),
        TrajectoryGroup(uid="b", trajectories=[_traj(2, 4, 0.5), _traj(2, 6, 1.0)]),
        TrajectoryGroup(uid="c", trajectories=[_traj(4, 1, 0.0), _traj(4, 3, 0.0)]),
    ]
    b = TrainBatch.from_groups(groups, pad_token_id=PAD)
    inp = AdvantageInputs(
        response_mask=b.loss_mask, token_rewards=b.token_rewards, group_ids=b.group_ids
    )
    b["advantages"], b["returns"] = ADV_ESTIMATORS.get("grpo")(inp, AdvantageConfig())
    return b


def _dense(b: TrainBatch) -> torch.Tensor:
    return token_level(b["advantages"], b.loss_mask)


def test_row_field_is_stored_once_per_row() -> None:
    b = _batch()
    assert b["advantages"].shape == (len(b), 1) and b.seq_len > 1
    assert b["advantages"][0, 0] > 0 > b["advantages"][1, 0]
    with pytest.raises(ValueError, match=r"\(B, 1, \.\.\.\)"):
        b["bad"] = torch.zeros(len(b), 2)


def test_select_split_micro_batches_keep_row_fields() -> None:
    b = _batch()
    sub = b.select([5, 0, 2])
    assert sub["advantages"].shape == (3, 1)
    assert sub["advantages"][:, 0].tolist() == b["advantages"][[5, 0, 2], 0].tolist()
    torch.testing.assert_close(_dense(sub), _dense(b)[[5, 0, 2], : sub.seq_len])
    for parts in (b.split(3), b.micro_batches(max_tokens=10), b.micro_batches(size=4)):
        assert all(p["advantages"].shape == (len(p), 1) for p in parts)
        assert torch.cat([p["advantages"] for p in parts]).equal(b["advantages"])


def test_concat_round_trip_and_pickle() -> None:
    b = _batch()
    for n in (1, 2, 4, len(b)):
        again = TrainBatch.concat(b.split(n))
        assert again["advantages"].shape == (len(b), 1)
        assert again["advantages"].equal(b["advantages"])
        assert again.loss_mask.equal(b.loss_mask) and again.seq_len == b.seq_len
    restored = pickle.loads(pickle.dumps(b))
    assert restored["advantages"].shape == (len(b), 1)
    assert restored["returns"].equal(b["returns"])


def test_concat_with_token_level_part_expands_row_values() -> None:
    b = _batch()
    left, right = b.select([0, 1, 2]), b.select([3, 4, 5])
    right["advantages"] = _dense(right)  # the same values, token-level (0 at padding)
    mixed = TrainBatch.concat([left, right])
    assert mixed["advantages"].shape == (len(b), b.seq_len)
    torch.testing.assert_close(token_level(mixed["advantages"], mixed.loss_mask), _dense(b))
