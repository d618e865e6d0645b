"""Training's sample of each step for `agentrl view`: whole groups, advantages, trainer
logprobs beside the rollout's, and the disk cap that deletes the oldest step files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.batch import TrainBatch
from agentrl.errors import ConfigError
from agentrl.rollout.io import load_trajectories
from agentrl.types import Message, TrajectoryGroup
from tests.viewer.runs import trajectory
from trainers.config import load_run_config
from trainers.trajectory_log import TrajectoryLog


def scored_batch(groups: list[TrajectoryGroup]) -> TrainBatch:
    batch = TrainBatch.from_groups(groups, pad_token_id=0)
    batch["old_logprobs"] = batch.rollout_logprobs - 0.25 * batch.loss_mask  # (B, T)
    batch["advantages"] = (batch["rewards"] - 0.5)[:, None]  # (B, 1), like GRPO
    return batch


def groups(n: int) -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup(
            uid=f"g{g}",
            trajectories=[
                trajectory(answer="84", reward=float(k), env="e/E-v0", uid=f"g{g}", version=3)
                for k in (0, 1)
            ],
        )
        for g in range(n)
    ]


def test_writes_whole_groups_with_advantages_and_trainer_logprobs(tmp_path: Path) -> None:
    gs = groups(3)
    log = TrajectoryLog(TrajectoryLog.Config(per_step=3), tmp_path)
    path = log.write(7, gs, scored_batch(gs))
    assert path == tmp_path / "trajectories" / "step_000007.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["group_index"] for r in rows] == [0, 0, 1, 1]  # 3 rounded up to whole groups
    assert {r["step"] for r in rows} == {7}
    assert [r["advantages"] for r in rows] == [[-0.5], [0.5], [-0.5], [0.5]]
    seg = rows[0]["segments"][0]
    lps = rows[0]["trainer_logprobs"][0]
    assert len(lps) == len(seg["token_ids"])
    for lp, rollout, m in zip(lps, seg["logprobs"], seg["loss_mask"], strict=True):
        assert lp == pytest.approx(rollout - 0.25 * m if m else rollout, abs=1e-4)
    assert len(load_trajectories(path)) == 4  # still plain trajectories to every reader


def test_disk_cap_removes_the_oldest_steps(tmp_path: Path) -> None:
    gs = groups(1)
    batch = scored_batch(gs)
    one = TrajectoryLog(TrajectoryLog.Config(), tmp_path).write(1, gs, batch)
    assert one is not None
    mb = one.stat().st_size / 1e6
    log = TrajectoryLog(TrajectoryLog.Config(max_total_mb=2.5 * mb), tmp_path)
    for step in range(2, 6):
        log.write(step, gs, batch)
    names = sorted(p.name for p in (tmp_path / "trajectories").iterdir())
    assert names == ["step_000004.jsonl", "step_000005.jsonl"]
    assert TrajectoryLog(TrajectoryLog.Config(per_step=0), tmp_path).write(9, gs, batch) is None


def test_config_keys_are_validated() -> None:
    cfg = load_run_config(None, ["data.envs=[{id: arith/Calculator-v0}]"])
    assert (cfg.trajectories.per_step, cfg.trajectories.max_total_mb) == (16, 256.0)
    with pytest.raises(ConfigError, match=r"trajectories\.per_step"):
        load_run_config(None, ["data.envs=[{id: arith/Calculator-v0}]", "trajectories.per_step=-1"])
    with pytest.raises(ConfigError, match=r"trajectories\.max_total_mb"):
        load_run_config(
            None, ["data.envs=[{id: arith/Calculator-v0}]", "trajectories.max_total_mb=0"]
        )
    with pytest.raises(ConfigError, match=r"trajectories\.max_image_mb"):
        load_run_config(
            None, ["data.envs=[{id: arith/Calculator-v0}]", "trajectories.max_image_mb=-1"]
        )


def test_token_level_advantages_are_written_per_token(tmp_path: Path) -> None:
    gs = groups(1)
    batch = scored_batch(gs)
    batch["advantages"] = batch.loss_mask * 2.0  # (B, T), like GAE
    path = TrajectoryLog(TrajectoryLog.Config(), tmp_path).write(1, gs, batch)
    assert path is not None
    r = json.loads(path.read_text().splitlines()[0])
    seg, token_adv = r["segments"][0], r["token_advantages"][0]
    assert len(token_adv) == len(seg["token_ids"]) and r["advantages"] == [2.0]
    assert token_adv[1:] == [2.0 * m for m in seg["loss_mask"][1:]]  # position 0: never a loss


def _png_url(n: int, fill: str) -> str:
    return "data:image/png;base64," + fill * n


def test_screenshots_past_max_image_mb_become_markers_last_image_first(tmp_path: Path) -> None:
    gs = groups(1)
    first, second = gs[0].trajectories
    # Three screenshots in the first trajectory's conversation and one in each report.
    shots = [_png_url(40_000, c) for c in "ABC"]
    for i, url in enumerate(shots):
        first.messages.append(
            Message(
                role="user",
                content=[
                    {"type": "text", "text": f"page {i}"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            )
        )
    first.report["screenshots"] = [_png_url(40_000, "D")]
    second.report["screenshots"] = [_png_url(40_000, "E")]
    first.segments[0].images = list(shots)  # a vision model's prompt: the same URLs again
    kept_live = [m.content for m in first.messages]
    cfg = TrajectoryLog.Config(max_image_mb=0.125)  # room for three of the five images
    path = TrajectoryLog(cfg, tmp_path).write(1, gs, scored_batch(gs))
    assert path is not None
    a, b = (json.loads(line) for line in path.read_text().splitlines())
    parts = [p for m in a["messages"] if isinstance(m["content"], list) for p in m["content"]]
    images = [p["image_url"]["url"][22] for p in parts if p["type"] == "image_url"]
    markers = [p["text"] for p in parts if "max_image_mb" in p.get("text", "")]
    # Each trajectory's last image is kept first (A's report shot D, B's E), then in order: A.
    assert images == ["A"]
    assert a["report"]["screenshots"][0][22] == "D" and b["report"]["screenshots"][0][22] == "E"
    assert len(markers) == 2 and "KB" in markers[0]
    assert (a["images_dropped"], "images_dropped" in b) == (2, False)
    # The segment's copies are not written (the cap would not bound them): only their count.
    assert a["segments"][0]["num_images"] == 3 and "images" not in a["segments"][0]
    assert len(path.read_text()) < 4 * 40_000  # the three kept images and the text
    assert first.segments[0].images == shots  # the live segment keeps its images
    # The live trajectory is untouched (the trainer and other writers still hold it).
    assert [m.content for m in first.messages] == kept_live
    assert first.messages[-1].content[1]["image_url"]["url"] == shots[-1]
    assert len(load_trajectories(path)) == 2
    none = TrajectoryLog(TrajectoryLog.Config(max_image_mb=0), tmp_path).write(
        2, gs, scored_batch(gs)
    )
    assert none is not None and "data:image/" not in none.read_text()
