"""Eval tasks are disjoint from training by content, through the code paths `agentrl train` uses.

SFT demonstrations come from ``trainers.sft.demonstrations``; RL and eval samples from
``DataConfig.sample`` rolled out by the ``RolloutCollector`` (whose ``RolloutContext.reset``
draws the task), here against a scripted generator. A task is its prompt and the answer that
solves it (the env's demonstration): GuessNumber shows one prompt for every secret, so its
tasks differ in the answer only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import ENVS, Env, StepResult, make_env
from agentrl.errors import ConfigError, EnvError
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.splits import reset_in_split, reset_sample, split_of, split_point
from agentrl.tiny import build_tokenizer
from agentrl.types import Message, Sample, user
from trainers.config import DataConfig, EnvEntry
from trainers.sft import demonstrations

NEEDS_SETUP = {
    "swe/Repo-v0",  # prepared repositories first; tests/agents/test_swe_agent.py
    "gui/Browser-v0",  # chromium (-m browser); tests/gui
}
BUILTIN = sorted(
    s.id for s in ENVS if s.entry_point_str.startswith("envs.") and s.id not in NEEDS_SETUP
)
N_TRAIN, N_EVAL = 64, 48


def test_split_of_is_stable_and_follows_the_fraction() -> None:
    keys = [f"task {i}" for i in range(4000)]
    share = sum(split_of(k, 0.25) == "eval" for k in keys) / len(keys)
    assert 0.22 < share < 0.28
    # a keyed hash, not Python's salted hash(): the same key lands in the same place in every
    # process and on every machine; changing the hash would silently reshuffle every split
    assert split_point('Compute "7 * 4" with the calculator.') == pytest.approx(0.1073295098)
    with pytest.raises(ConfigError, match=r"data\.eval_fraction"):
        split_of("x", 1.0)


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(build_tokenizer())


Task = tuple[str, str]  # (first prompt, the demonstration's final assistant text)


def _task(messages: list[Message]) -> Task:
    prompt = next(m.text for m in messages if m.role == "user")
    final = next(m.text for m in reversed(messages) if m.role == "assistant")
    return prompt, final


async def _solved(sample: Sample) -> Task:
    """The task ``sample`` draws (the same reset the rollout made) and its oracle answer."""
    env = make_env(sample.env_id, **sample.env_kwargs)
    obs, _ = await reset_sample(env, sample)
    return _task([*obs, *(env.demonstration() or [])])


def _rollout_tasks(data: DataConfig, template: ChatTemplate, *, eval: bool, n: int) -> set[Task]:
    """Roll out samples 0..n-1 of the train or eval stream through the collector, as the
    trainer does; each rollout's prompt must be the task its sample draws."""
    samples = [data.sample(i, eval=eval) for i in range(n)]
    cfg = CollectorConfig(agent="single_turn", group_size=1, max_new_tokens=8)
    gen = ScriptedGenerator(template, ["Answer: 0"])
    groups = asyncio.run(RolloutCollector(cfg, gen, template).collect(samples))
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == n and not any(t.status.is_infra_failure for t in trajs), [
        t.error for t in trajs if t.error
    ]

    async def solve_all() -> list[Task]:
        return list(await asyncio.gather(*(_solved(t.sample) for t in trajs)))

    tasks = asyncio.run(solve_all())
    for t, (prompt, _) in zip(trajs, tasks, strict=True):
        assert _task(t.messages)[0] == prompt
    return set(tasks)


@pytest.mark.parametrize("env_id", BUILTIN)
def test_eval_tasks_never_appear_in_sft_demos_or_rl_samples(
    env_id: str, template: ChatTemplate
) -> None:
    data = DataConfig(envs=[EnvEntry(id=env_id)], seed=0)
    demos = {_task(c.messages) for c in demonstrations(data, N_TRAIN)}
    train = _rollout_tasks(data, template, eval=False, n=N_TRAIN)
    evals = _rollout_tasks(data, template, eval=True, n=N_EVAL)
    assert evals and train and demos
    leaked = evals & (demos | train)
    assert not leaked, f"{len(leaked)} eval tasks also trained on, e.g. {sorted(leaked)[0]}"
    if env_id != "games/GuessNumber-v0":  # one prompt for all of its tasks
        prompts = {p for p, _ in demos | train}
        assert not {p for p, _ in evals} & prompts


def test_without_the_split_seeds_alone_leak_eval_tasks() -> None:
    """The bug this guards against: 81 one-digit tasks, 128 seeds, repeats across streams."""
    data = DataConfig(envs=[EnvEntry(id="arith/Calculator-v0", kwargs={"digits": 1})], seed=0)
    by_seed = [replace_split(data.sample(i)) for i in range(N_TRAIN)]
    held_out = [replace_split(data.sample(i, eval=True)) for i in range(N_EVAL)]

    async def tasks(samples: list[Sample]) -> set[Task]:
        return set(await asyncio.gather(*(_solved(s) for s in samples)))

    assert asyncio.run(tasks(held_out)) & asyncio.run(tasks(by_seed))


def replace_split(sample: Sample) -> Sample:
    return Sample(env_id=sample.env_id, env_kwargs=sample.env_kwargs, seed=sample.seed)


class _OnePrompt(Env):
    """Hidden state behind a fixed prompt and no task_key: the split cannot see the tasks."""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await super().areset(seed=seed)
        return [user("Guess.")], {}

    async def astep(self, action: Message) -> StepResult:
        return [], 0.0, True, False, {}


def test_an_env_whose_tasks_look_alike_gets_a_clear_error() -> None:
    env = _OnePrompt()
    split = split_of("user: Guess.")
    other = "eval" if split == "train" else "train"
    obs, _ = asyncio.run(reset_in_split(env, seed=0, split=split))
    assert obs[0].text == "Guess."
    with pytest.raises(EnvError, match=r"override Env\.task_key"):
        asyncio.run(reset_in_split(env, seed=0, split=other))


def test_same_sample_same_task() -> None:
    data = DataConfig(envs=[EnvEntry(id="arith/Calculator-v0")], seed=0)

    async def twice() -> tuple[Task, Task]:
        s = data.sample(5, eval=True)
        return await _solved(s), await _solved(s)

    a, b = asyncio.run(twice())
    assert a == b
