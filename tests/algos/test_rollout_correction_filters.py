"""Rollout importance-sampling correction and DAPO filters."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import (
    DynamicSampler,
    ISCorrectionConfig,
    group_has_signal,
    nonuniform_groups,
    overlong_filter_mask,
    overlong_penalty,
    rollout_is_weights,
)
from agentrl.errors import ConfigError, TrainingError

OLD = torch.tensor([[0.1, 1.0, -0.5, 3.0], [0.0, 0.2, 0.0, 0.0]])
ROLLOUT = torch.zeros(2, 4)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_token_level_tis() -> None:
    w, met = rollout_is_weights(OLD, ROLLOUT, MASK, ISCorrectionConfig(level="token", cap=2.0))
    e = math.exp
    expected = torch.tensor([[e(0.1), 2.0, e(-0.5), 0.0], [1.0, e(0.2), 0.0, 0.0]])
    torch.testing.assert_close(w, expected)
    assert met["is_capped_frac"].item() == pytest.approx(1 / 5)
    assert met["is_weight_max"].item() == pytest.approx(2.0)
    assert met["mismatch_k1"].item() == pytest.approx(-(0.1 + 1.0 - 0.5 + 0.2) / 5)
    k3 = sum(e(x) - x - 1 for x in (0.1, 1.0, -0.5, 0.0, 0.2)) / 5
    assert met["mismatch_k3"].item() == pytest.approx(k3)


def test_sequence_level_tis() -> None:
    w, met = rollout_is_weights(OLD, ROLLOUT, MASK, ISCorrectionConfig(level="sequence", cap=1.5))
    # sequence log-ratios 0.6 and 0.2 -> weights min(e^0.6, 1.5) = 1.5 and e^0.2
    expected = torch.tensor([[1.5, 1.5, 1.5, 0.0], [math.exp(0.2)] * 2 + [0.0, 0.0]])
    torch.testing.assert_close(w, expected)
    assert met["is_capped_frac"].item() == pytest.approx(0.5)
    assert met["is_weight_mean"].item() == pytest.approx((1.5 + math.exp(0.2)) / 2)


def test_tis_config_errors() -> None:
    with pytest.raises(ConfigError, match="cap"):
        ISCorrectionConfig(cap=0.0)
    with pytest.raises(ConfigError, match="token"):
        ISCorrectionConfig(level="tokens")  # type: ignore[arg-type]


def test_nonuniform_groups() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0])
    ids = torch.tensor([5, 5, 9, 9, -1, -1, 42])  # 42 is a group of one
    assert nonuniform_groups(scores, ids).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    assert group_has_signal([[1, 1], [0, 1], [], [3]]) == [False, True, False, False]


def test_dynamic_sampler_accumulates_until_full() -> None:
    s = DynamicSampler[str](target=3, max_rounds=3)
    s.add(["a", "b", "c"], [True, False, False])
    assert not s.full
    s.add(["d", "e", "f"], torch.tensor([True, True, True]))
    assert s.full and s.rounds == 2 and s.seen == 6
    assert s.take() == ["a", "d", "e"]
    assert s.num_kept == 0 and s.rounds == 0  # overflow "f" dropped by default
    with pytest.raises(TrainingError, match="take"):
        s.take()


def test_dynamic_sampler_overflow_and_round_limit() -> None:
    s = DynamicSampler[int](target=2, keep_overflow=True)
    s.add([1, 2, 3], [True, True, True])
    assert s.take() == [1, 2]
    assert s.num_kept == 1
    limited = DynamicSampler[int](target=5, max_rounds=2, max_rounds_key="algo.max_filter_rounds")
    limited.add([1], [False])
    with pytest.raises(TrainingError, match="after 2 rounds") as exc:
        limited.add([2], [True])
    assert "Raise algo.max_filter_rounds (now 2)" in str(exc.value)  # the key a user sets
    with pytest.raises(ConfigError, match="keep flags"):
        DynamicSampler[int](target=1).add([1, 2], [True])


def test_overlong_filter_and_penalty() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = overlong_filter_mask(mask, torch.tensor([False, True]))
    assert out.tolist() == [[1, 1, 0], [0, 0, 0]]
    pen = overlong_penalty(torch.tensor([5, 6, 8, 10, 11]), max_len=10, cache_len=4)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ConfigError):
        overlong_penalty(torch.tensor([1]), max_len=4, cache_len=5)
