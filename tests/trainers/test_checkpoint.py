from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from agentrl.errors import ConfigError
from trainers.checkpoint import (
    CheckpointManager,
    TrainerState,
    capture_rng,
    load_state,
    restore_rng,
)


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_round_trip_restores_rng_cursor_and_version(tmp_path) -> None:
    mgr = CheckpointManager(CheckpointManager.Config(keep_last=2), tmp_path)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    tmp = mgr.begin(3)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "weights.bin").write_bytes(b"w")
    path = mgr.commit(
        tmp,
        TrainerState(
            step=3, weight_version=3, data_cursor=24, rng=capture_rng(), extra={"sft_done": True}
        ),
    )
    expected = _draws()
    _draws()  # move every generator on

    state = load_state(path)
    restore_rng(state.rng)
    assert _draws() == expected
    assert (state.step, state.weight_version, state.data_cursor) == (3, 3, 24)
    assert state.extra == {"sft_done": True}
    assert (path / "actor" / "weights.bin").read_bytes() == b"w"


def test_keep_last_and_latest_ignore_unfinished_saves(tmp_path) -> None:
    mgr = CheckpointManager(CheckpointManager.Config(keep_last=2), tmp_path)
    for step in (1, 2, 3):
        mgr.commit(mgr.begin(step), TrainerState(step=step, weight_version=step, data_cursor=0))
    mgr.begin(4)  # a save killed half way: never committed
    assert [p.name for p in mgr.list()] == ["step_000002", "step_000003"]
    assert mgr.latest() == mgr.path_for(3)
    mgr.prune()
    assert not mgr.path_for(4).with_suffix(".tmp").exists()


def test_should_save_every_n_and_at_the_end(tmp_path) -> None:
    mgr = CheckpointManager(CheckpointManager.Config(every=2), tmp_path)
    assert [s for s in range(1, 6) if mgr.should_save(s, last_step=5)] == [2, 4, 5]


def test_bad_config_and_missing_checkpoint_are_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="keep_last"):
        CheckpointManager(CheckpointManager.Config(keep_last=0), tmp_path)
    with pytest.raises(ConfigError, match="not a checkpoint"):
        load_state(tmp_path)
