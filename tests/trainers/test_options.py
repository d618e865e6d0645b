"""Every training option of the algo / reward sections, reached through ``agentrl train``.

Each option gets a one-step run of the tiny model (no SFT: a random policy whose 12-token
replies are all cut at ``rollout.max_new_tokens``; the overlong filter's run allows 48, so
some end) and an assertion on what it must change.
All runs share the rubric below, which gives rollouts different rewards (the env's reward is 0
for a random policy), and all sample the same tokens (seeded requests), so the plain run is
the reference the others are compared with.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_driver import RECIPE

from agentrl.batch import TrainBatch
from agentrl.config import to_yaml
from agentrl.errors import ConfigError
from agentrl.logging import read_jsonl
from agentrl.types import RolloutStatus, Sample, Segment, Trajectory, TrajectoryGroup
from tests import docblocks
from trainers.cli import train_main
from trainers.config import load_run_config
from trainers.driver import Trainer

SCORES: list[float] = []  # every score varied_reward gave, in call order
SEEN: list[tuple[RolloutStatus, int]] = []  # the status and generated tokens of each rollout


def varied_reward(completion: Trajectory, info: Mapping[str, Any]) -> float:
    """A reward in [0, 1] that differs between rollouts: a hash of the generated tokens."""
    ids = [
        t for s in completion.segments for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m
    ]
    score = (sum(ids) % 97) / 96
    SCORES.append(score)
    SEEN.append((completion.status, len(ids)))
    return score


RUBRIC = "reward.rubric=[{fn: 'test_options:varied_reward', weight: 1.0}]"
TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "sft.steps=0",
    "train.steps=1",
    "train.batch_size=2",
    "train.mini_batch_size=0",
    "train.ppo_epochs=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "rollout.max_turns=2",
    "eval.num_samples=0",
    "checkpoint.save_final=false",
    "checkpoint.export_hf=false",
    "logging.console=false",
    RUBRIC,
]
ENV = "data.envs=[{id: arith/Calculator-v0}]"
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "training.md"


def train(tmp_path: Path, name: str, *extra: str) -> list[dict[str, float]]:
    """``agentrl train`` (its entry function) on the tiny config; the metrics rows."""
    del SCORES[:], SEEN[:]
    overrides = [*TINY, f"output_dir={tmp_path}", f"name={name}", *extra]
    summary = train_main(RECIPE, overrides)
    assert summary["steps"] == load_run_config(RECIPE, overrides).train.steps
    return read_jsonl(tmp_path / name / "metrics.jsonl")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> dict[str, Any]:
    """The reference run: the rubric only. Its step-1 metrics and the rubric's scores."""
    (row,) = train(tmp_path_factory.mktemp("plain"), "plain")
    return {"row": row, "scores": list(SCORES)}


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["reward.rubric=[{fn: 'no_such_module:f'}]"],
            r"reward\.rubric\[0\]\.fn 'no_such_module': no module",
        ),
        (["reward.rubric=[{fn: 'agentrl.reward:no_such_fn'}]"], "has no 'no_such_fn'"),
        (["reward.rubric=[{fn: agentrl.reward}]"], r"'package\.module:function'"),
        (["reward.rubric=[{fn: 'agentrl.reward:Completion'}]"], "not a function"),
        (["algo.kl.controller=pid"], "fixed or adaptive"),
        (["algo.kl.controller=adaptive"], r"algo\.kl\.coef=0\.001"),
        (["algo.kl.controller=adaptive", "algo.kl.coef=0.1", "algo.kl.target=0"], "kl.target"),
        (["algo.rollout_is.enabled=true", "algo.rollout_is.level=seq"], "token or sequence"),
        (["algo.rollout_is.enabled=true", "algo.rollout_is.cap=0"], r"rollout_is\.cap"),
        (["algo.overlong.penalty=true"], r"try algo\.overlong\.max_len=4096"),
        (
            [
                "algo.overlong.penalty=true",
                "algo.overlong.max_len=16",
                "algo.overlong.cache_len=32",
            ],
            r"algo\.overlong\.cache_len=4",
        ),
    ],
)
def test_bad_options_fail_at_validation_naming_the_key(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_run_config(None, [ENV, *overrides])


def test_good_options_validate() -> None:
    cfg = load_run_config(
        None,
        [
            ENV,
            "algo.adv_estimator=remax",
            "reward.rubric=[{fn: 'agentrl.reward:env_reward'}, {fn: 'test_options:varied_reward', weight: 0}]",
            "algo.kl.coef=0.01",
            "algo.kl.controller=adaptive",
            "algo.rollout_is.enabled=true",
            "algo.rollout_is.level=sequence",
            "algo.overlong.filter=true",
            "algo.overlong.penalty=true",
            "algo.overlong.max_len=64",
            "algo.overlong.cache_len=16",
        ],
    )
    rubric = cfg.reward.build_rubric()
    assert rubric is not None
    assert [(e.name, e.weight) for e in rubric.entries] == [
        ("env_reward", 1.0),
        ("varied_reward", 0.0),
    ]


def test_training_guide_option_snippets_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every recipe fragment of the guide's "Algorithm options" loads, its Python module too."""
    text = GUIDE.read_text().partition("## Algorithm options")[2].partition("\n## ")[0]
    (module,) = [b.code for b in docblocks.runnable("docs/guides/training.md", "python")]
    assert module in text  # the one python block, in this section
    fragments = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert len(fragments) == 5
    (tmp_path / "my_rewards.py").write_text(module)
    monkeypatch.chdir(tmp_path)  # rubric modules resolve from the current directory first
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    default = to_yaml(load_run_config(None, [ENV]))
    for i, fragment in enumerate(fragments):
        recipe = tmp_path / f"fragment{i}.yaml"
        recipe.write_text(fragment)
        assert to_yaml(load_run_config(recipe, [ENV])) != default  # unknown keys fail to load
    rubric = load_run_config(tmp_path / "fragment0.yaml", [ENV]).reward.build_rubric()
    assert rubric is not None and [e.weight for e in rubric.entries] == [1.0, 0.1, 0.0]


def test_overlong_counts_every_segment_of_a_trajectory(tmp_path: Path) -> None:
    """The penalty is by the generated tokens of the whole trajectory (all its rows); the
    filter drops the rows of truncated_length rollouts, tokens and row."""

    def segment(prompt: list[int], gen: list[int]) -> Segment:
        s = Segment()
        s.extend_prompt(prompt)
        s.extend_generated(gen, [-0.5] * len(gen), 0)
        return s

    sample = Sample(env_id="x", uid="g")
    two_segments = Trajectory(
        sample=sample, segments=[segment([1, 2], [3, 4, 5]), segment([6], [7, 8])], reward=1.0
    )
    cut = Trajectory(
        sample=sample,
        segments=[segment([1, 2], [9])],
        reward=0.0,
        status=RolloutStatus.TRUNCATED_LENGTH,
    )
    batch = TrainBatch.from_groups([TrajectoryGroup(uid="g", trajectories=[two_segments, cut])], 0)
    cfg = load_run_config(
        None,
        [
            ENV,
            f"output_dir={tmp_path}",
            "algo.overlong.filter=true",
            "algo.overlong.penalty=true",
            "algo.overlong.max_len=6",
            "algo.overlong.cache_len=4",
        ],
    )
    m = Trainer(cfg).overlong(batch)
    # 5 generated tokens over two rows: (6 - 4 - 5) / 4 = -0.75 on both; 1 token: no penalty.
    assert batch.rewards.tolist() == [0.25, 0.25, 0.0]
    assert batch.token_rewards.sum(-1).tolist() == [0.25, 0.25, 0.0]
    assert m["train/overlong_penalty_mean"] == pytest.approx(-0.5)
    assert batch.loss_mask.sum(-1).tolist() == [3.0, 2.0, 0.0]
    assert batch.sample_mask.tolist() == [1.0, 1.0, 0.0]
    assert m["train/overlong_filtered_rate"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------ one run per option


def test_rubric_rewards_replace_the_env_reward(plain: dict[str, Any]) -> None:
    row, scores = plain["row"], plain["scores"]
    assert len(scores) == row["rollout/num_trajectories"] == 4
    # A random policy earns 0 from the env; the rubric's scores are the rewards.
    assert row["rollout/reward_mean"] == pytest.approx(sum(scores) / 4)
    assert row["rollout/reward/varied_reward"] == pytest.approx(sum(scores) / 4)
    assert row["rollout/reward_std"] > 0 and row["train/advantage_abs_mean"] > 0
    assert row["train/score_mean"] == pytest.approx(row["rollout/reward_mean"])


def test_rollout_is_correction_weights_the_loss(tmp_path: Path, plain: dict[str, Any]) -> None:
    # The servers' logprobs equal the trainer's here (fp32, same weights), so every ratio is
    # ~1; a cap of 0.5 makes every weight exactly 0.5, which halves the policy gradient.
    (row,) = train(tmp_path, "is", "algo.rollout_is.enabled=true", "algo.rollout_is.cap=0.5")
    base = plain["row"]
    assert row["train/is_weight_mean"] == pytest.approx(0.5)
    assert row["train/is_capped_frac"] == 1.0
    assert abs(row["train/is_mismatch_k3"]) < 1e-6
    assert row["train/num_loss_tokens"] == base["train/num_loss_tokens"] > 0
    assert base["train/grad_norm"] > 0
    assert row["train/grad_norm"] == pytest.approx(0.5 * base["train/grad_norm"], rel=1e-4)


def test_overlong_filter_masks_truncated_rollouts(tmp_path: Path, ray_local: None) -> None:
    # 48 new tokens: some replies of the random policy end (it samples a stop token), the
    # others run out of tokens (3 of 4 with these seeds on the dynamic engine's sampling
    # stream; the static engine's stream truncates all 4, so the engine is pinned).
    (row,) = train(
        tmp_path,
        "filter",
        "algo.overlong.filter=true",
        "rollout.max_new_tokens=48",
        "inference.engine=dynamic",
    )
    truncated = [n for status, n in SEEN if status is RolloutStatus.TRUNCATED_LENGTH]
    kept = [n for status, n in SEEN if status is not RolloutStatus.TRUNCATED_LENGTH]
    assert truncated and kept, SEEN
    assert row["rollout/status/truncated_length"] == len(truncated) / len(SEEN)
    assert row["train/overlong_filtered_rate"] == len(truncated) / len(SEEN)
    assert row["train/num_loss_tokens"] == sum(kept) > 0  # the truncated rows' tokens are gone


def test_overlong_penalty_lowers_the_rewards(tmp_path: Path, plain: dict[str, Any]) -> None:
    (row,) = train(
        tmp_path,
        "penalty",
        "algo.overlong.penalty=true",
        "algo.overlong.max_len=16",
        "algo.overlong.cache_len=8",
    )
    base = plain["row"]
    length = row["rollout/response_len_mean"]
    assert length == 12.0  # every reply: 12 tokens, 4 into the 8-token ramp before max_len
    expected = -(length - (16 - 8)) / 8
    assert row["train/overlong_penalty_mean"] == pytest.approx(expected)
    assert row["rollout/reward_mean"] == pytest.approx(base["rollout/reward_mean"])
    assert row["train/score_mean"] == pytest.approx(base["train/score_mean"] + expected)


def test_remax_runs_with_greedy_baselines(tmp_path: Path, plain: dict[str, Any]) -> None:
    (row,) = train(tmp_path, "remax", "algo.adv_estimator=remax")
    # The rubric scored the 4 sampled rollouts, then one greedy rollout per group (2).
    assert len(SCORES) == 6 and SCORES[:4] == plain["scores"]
    assert row["train/baseline_fallback_rate"] == 0.0
    assert row["train/baseline_reward_mean"] == pytest.approx(sum(SCORES[4:]) / 2)
    assert row["timing/baseline_s"] > 0
    assert row["train/advantage_abs_mean"] > 0 and row["train/grad_norm"] > 0


def test_adaptive_kl_coefficient_moves_is_logged_and_resumes(
    tmp_path: Path, ray_local: None
) -> None:
    coef, target, horizon = 0.05, 1.0, 10
    overrides = [
        *TINY,
        f"output_dir={tmp_path}",
        "name=kl",
        "train.steps=2",
        "checkpoint.every=1",
        "checkpoint.keep_last=2",
        f"algo.kl.coef={coef}",
        "algo.kl.controller=adaptive",
        f"algo.kl.target={target}",
        f"algo.kl.horizon={horizon}",
    ]
    first = Trainer(load_run_config(RECIPE, overrides))
    try:  # step 1 and its checkpoint, then stop as if killed
        first.setup()
        first.step()
    finally:
        first.close()
    train_main(RECIPE, overrides, resume=True)  # step 2, from the checkpoint

    rows = read_jsonl(tmp_path / "kl" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    kl1 = rows[0]["train/kl"]
    assert rows[0]["train/kl_coef"] == coef
    error = min(max(kl1 / target - 1, -0.2), 0.2)
    moved = coef * (1 + error * 4 / horizon)  # 4 sequences in step 1
    assert moved != pytest.approx(coef)
    state = json.loads(
        (tmp_path / "kl" / "checkpoints" / "step_000001" / "trainer_state.json").read_text()
    )
    assert state["extra"]["kl_coef"] == pytest.approx(moved)
    assert rows[1]["train/kl_coef"] == pytest.approx(moved)  # the resumed run continued from it
