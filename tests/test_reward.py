"""Rubrics: weights, zero-weight metrics, group-aware functions, failures as values."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl.errors import ConfigError, RewardError
from agentrl.reward import Rubric, extract_answer, group_reward
from agentrl.types import Message, RolloutStatus, Sample, Trajectory


def correct(completion: list[Message], info: dict) -> float:
    return float(extract_answer(completion[-1].text) == info["answer"])


async def short(completion: list[Message], info: dict) -> float:
    await asyncio.sleep(0)
    return 1.0 if len(completion[-1].text) < 12 else 0.0


def length(completion: list[Message], info: dict) -> int:
    return len(completion[-1].text)


@group_reward
def rank_by_length(completions: list[list[Message]], infos: list[dict]) -> list[float]:
    """1 for the shortest completion of the group, 0 for the rest."""
    lens = [len(c[-1].text) for c in completions]
    return [float(n == min(lens)) for n in lens]


def reply(text: str) -> list[Message]:
    return [Message(role="user", content="q"), Message(role="assistant", content=text)]


async def test_weighted_total_components_and_zero_weight_metrics() -> None:
    rubric = Rubric([(correct, 1.0), (short, 0.5), (length, 0.0)])
    r = await rubric.score(reply("Answer: 42"), {"answer": "42"})
    assert r.total == pytest.approx(1.5)
    assert r.components == {"correct": 1.0, "short": 1.0}
    assert r.metrics == {"length": 10.0}
    assert r.error is None and r.status is RolloutStatus.COMPLETED
    wrong = await rubric.score(reply("Answer: 41 is my final guess"), {"answer": "42"})
    assert wrong.total == 0.0 and wrong.components == {"correct": 0.0, "short": 0.0}


async def test_group_aware_function_sees_the_whole_group_in_order() -> None:
    rubric = Rubric([correct, (rank_by_length, 2.0)])
    group = [reply("Answer: 42."), reply("Answer: 42"), reply("Answer: 7")]
    infos = [{"answer": "42"}] * 3
    results = await rubric.score_group(group, infos)
    assert [r.total for r in results] == [1.0, 1.0, 2.0]
    assert [r.components["rank_by_length"] for r in results] == [0.0, 0.0, 1.0]
    single = await rubric.score(reply("Answer: 42"), {"answer": "42"})  # a group of one
    assert single.total == 3.0


async def test_failing_function_is_an_error_result_not_a_crash() -> None:
    def boom(completion: object, info: object) -> float:
        raise ValueError("no judge")

    rubric = Rubric([correct, (boom, 1.0)])
    r = await rubric.score(reply("Answer: 42"), {"answer": "42"})
    assert r.status is RolloutStatus.ERROR_REWARD
    assert r.error == "reward 'boom' raised ValueError: no judge"
    assert r.total == 0.0 and r.components == {"correct": 1.0}
    with pytest.raises(RewardError, match="no judge"):
        r.raise_for_error()


async def test_bad_return_values_and_group_length_mismatch_are_errors() -> None:
    @group_reward
    def too_few(completions: list, infos: list) -> list[float]:
        return [1.0]

    rubric = Rubric([(lambda c, i: math.nan, 1.0, "nan"), (lambda c, i: "yes", 1.0, "text")])
    r = await rubric.score(reply("x"))
    assert "reward 'nan' returned nan" in (r.error or "")
    assert "reward 'text' returned str 'yes'" in (r.error or "")
    results = await Rubric([too_few]).score_group([reply("a"), reply("b")])
    assert all("must return 2 scores, got 1" in (x.error or "") for x in results)


async def test_bool_scores_duplicate_names_and_trajectories() -> None:
    def solved(traj: Trajectory, info: dict) -> bool:
        return traj.messages[-1].text == "done"

    rubric = Rubric([solved, (solved, 0.0)])
    assert [e.name for e in rubric.entries] == ["solved", "solved_2"]
    traj = Trajectory(sample=Sample(env_id="x"), messages=reply("done"))
    r = await rubric.score(traj)
    assert r.total == 1.0 and r.metrics == {"solved_2": 1.0}


def test_rubric_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        Rubric([])
    with pytest.raises(ConfigError, match="finite number"):
        Rubric([(correct, "high")])
    with pytest.raises(ConfigError, match="fn, \\(fn, weight\\)"):
        Rubric([("correct", 1.0)])


def test_extract_answer() -> None:
    assert extract_answer("so <answer> 12 </answer>") == "12"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("Thinking...\nAnswer: -4.") == "-4"
    assert extract_answer("answer = 7\nAnswer: 8") == "8"
    assert extract_answer("I think it is 5") is None
