"""SWEAgentLoop + swe/Repo-v0 through the real collector, real local sandboxes and grading.

A scripted model fixes the tiny repo of ``tests/envs/swe_repo.py`` with the editor tools or
with bash blocks; grading runs the hidden tests in a fresh sandbox.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import ENVS, Env, register_env
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import Message, RolloutStatus, Sample, Trajectory
from envs.swe.pyenv import TestEnv
from envs.swe.task import SWETask, save_tasks
from tests.envs.swe_repo import needs_local

pytestmark = needs_local
ENV_ID = "test-swe/Repo-v0"
FIX = "sed -i '0,/return a - b/s//return a + b/' calc/ops.py"


@pytest.fixture
def swe_sample(
    repo: tuple[Path, SWETask],
    repo_test_env: TestEnv,
    tmp_path: Path,
) -> Any:
    r, task = repo
    tasks = save_tasks(tmp_path / "tasks.jsonl", [task])
    if ENV_ID not in ENVS:
        register_env(ENV_ID, "envs.swe.env:SWEEnv")
    repo_envs = {
        task.repo: {
            "repo_dir": str(r),
            "python": repo_test_env.python,
            "ro_paths": [repo_test_env.prefix],
        }
    }

    def make(**kw: Any) -> Sample:
        return Sample(
            env_id=ENV_ID,
            env_kwargs={"tasks": str(tasks), "repo_envs": repo_envs, **kw},
            seed=0,
        )

    return make


async def run(chatml: ChatTemplate, replies: list[str], sample: Sample, **cfg: Any) -> Trajectory:
    gen = ScriptedGenerator(chatml, lambda _p, turn: replies[min(turn, len(replies) - 1)])
    config = CollectorConfig(group_size=1, agent="swe", max_tokens=8192, **cfg)
    [group] = await RolloutCollector(config, gen, chatml).collect([sample])
    return group.trajectories[0]


def bash(cmd: str) -> str:
    return f"I will run:\n```bash\n{cmd}\n```"


def tool(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


async def test_bash_mode_fixes_and_submits_and_sees_a_scrubbed_history(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    probe = "git log --all --oneline | wc -l; git tag | wc -l; git remote | wc -l; " + (
        "git reflog | wc -l; grep -rn test_add tests | wc -l"
    )
    traj = await run(chatml, [bash(probe), bash(FIX), bash("submit")], swe_sample(mode="bash"))
    assert traj.status is RolloutStatus.COMPLETED, traj.error
    assert traj.reward == 1.0 and traj.metrics["success"] == 1.0
    seen = traj.messages[3].text  # one commit, no tags, remotes or hidden tests
    assert "<returncode>0</returncode>" in seen
    assert seen.split("<output>\n")[1].split()[:5] == ["1", "0", "0", "1", "0"], seen
    assert traj.report["resolved"] is True
    assert traj.report["FAIL_TO_PASS"] == {
        "tests/test_ops.py::test_add": "passed",
        "tests/test_ops.py::test_add_negative": "passed",
    }
    assert "+    return a + b" in traj.report["model_patch"]


async def test_tools_mode_edits_with_the_editor_and_submits(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    edit = tool(
        "str_replace_editor",
        command="str_replace",
        path="/workspace/calc/ops.py",
        old_str="def add(a, b):\n    return a - b",
        new_str="def add(a, b):\n    return a + b",
    )
    traj = await run(chatml, [edit, tool("submit", answer="fixed add")], swe_sample())
    assert traj.status is RolloutStatus.COMPLETED, traj.error
    assert traj.reward == 1.0, traj.report
    assert traj.metrics["tool_calls"] == 2.0 and traj.metrics["tool_errors"] == 0.0


async def test_a_reply_without_a_fix_scores_zero_with_a_report(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    traj = await run(chatml, ["I think it is fine."], swe_sample())
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 0.0
    assert set(traj.report["FAIL_TO_PASS"].values()) == {"failed"}
    assert traj.trainable  # the model's failure, not the machinery's


async def test_the_turn_limit_still_grades_the_workspace(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    traj = await run(chatml, [bash(FIX), bash("ls")], swe_sample(mode="bash"), max_turns=3)
    assert traj.status is RolloutStatus.TRUNCATED_MAX_TURNS
    assert traj.reward == 1.0 and traj.report["resolved"] is True and traj.num_turns == 3


async def test_long_outputs_are_cut_and_old_ones_elided(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    from agents.swe_agent import SWEAgentLoop

    replies = [bash("seq 1 100000"), bash("ls"), bash("ls calc"), bash("echo hi"), bash("submit")]
    sample = swe_sample(mode="bash", max_output_chars=2000)
    sample = dataclasses.replace(sample, agent="test-swe/windowed")
    from agentrl.agent import AGENTS, register_agent

    if "test-swe/windowed" not in AGENTS:
        register_agent("test-swe/windowed", SWEAgentLoop, history_window=2)
    traj = await run(chatml, replies, sample)
    assert traj.status is RolloutStatus.COMPLETED, traj.error
    assert traj.metrics["compactions"] >= 1 and len(traj.segments) >= 2
    observations = [m.text for m in traj.messages if m.role == "user"][1:]
    assert observations[0].startswith("[output elided") and "100000" not in observations[0]
    assert not observations[-1].startswith("[output elided")
    n = re.match(r"\[output elided to save context: (\d+) characters", observations[0])
    assert n is not None and int(n.group(1)) < 2200  # cut to max_output_chars before


async def test_a_task_whose_base_commit_is_missing_is_masked_not_scored(
    chatml: ChatTemplate,
    swe_sample: Any,
    repo: tuple[Path, SWETask],
    tmp_path: Path,
) -> None:
    _, task = repo
    broken = save_tasks(tmp_path / "b.jsonl", [dataclasses.replace(task, base_commit="f" * 40)])
    sample = swe_sample(mode="bash")
    sample = dataclasses.replace(sample, env_kwargs={**sample.env_kwargs, "tasks": str(broken)})
    traj = await run(chatml, [bash("submit")], sample)
    assert traj.status is RolloutStatus.ERROR_ENV and not traj.trainable
    assert "base_commit" in (traj.error or "")


@contextlib.asynccontextmanager
async def demonstrated(sample: Sample) -> AsyncIterator[tuple[Env, list[Message], list[Message]]]:
    """The sample's env, reset, with its oracle demonstration and that demonstration's actions."""
    from agentrl.env import make_env

    env = make_env(sample.env_id, **sample.env_kwargs)
    try:
        await env.areset(seed=0)
        demo = await env.ademonstration()
        assert demo is not None
        yield env, demo, [m for m in demo if m.role == "assistant"]
    finally:
        await env.aclose()


@pytest.mark.parametrize("mode", ["tools", "bash"])
async def test_the_oracle_demonstration_solves_the_task_when_replayed(
    swe_sample: Any, mode: str
) -> None:
    """SFT's demonstration: tests run, the gold fix applied (editor or git apply), submit;
    recorded in a scratch sandbox, then replayed on the episode's own to reward 1."""
    async with demonstrated(swe_sample(mode=mode)) as (env, demo, actions):
        assert "pytest" in str(actions[0].tool_calls or actions[0].text)
        if mode == "tools":
            assert actions[1].tool_calls[0].name == "str_replace_editor"
            assert actions[-1].tool_calls[0].name == "submit"
        assert "1 passed" in demo[1].text  # the probe ran (the failing tests are hidden here)
        for i, action in enumerate(actions):
            obs, reward, done, _, info = await env.astep(action)
            if i + 1 < len(actions):
                assert not done and [m.text[:40] for m in obs][:1] == [demo[2 * i + 1].text[:40]]
        assert done and reward == 1.0, info["report"]


async def test_an_empty_patch_scores_zero_ungraded_when_grade_empty_patch_is_off(
    chatml: ChatTemplate, swe_sample: Any
) -> None:
    traj = await run(chatml, ["I think it is fine."], swe_sample(grade_empty_patch=False))
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 0.0 and traj.trainable
    assert traj.report == {"resolved": False, "reward": 0.0, "graded": False, "model_patch": ""}


async def test_a_curriculum_demonstration_runs_its_probe_and_still_solves_the_task(
    swe_sample: Any,
) -> None:
    """demo_probe replaces the test run; demo_edit=line falls back to the hunk here, since the
    calc repo's buggy line (``return a - b``) is also sub's."""
    sample = swe_sample(demo_probe="git grep -n 'a - b' -- calc", demo_edit="line")
    async with demonstrated(sample) as (env, demo, actions):
        assert actions[0].tool_calls[0].arguments == {"command": "git grep -n 'a - b' -- calc"}
        assert "calc/ops.py:2:    return a - b" in demo[1].text
        edit = actions[1].tool_calls[0].arguments
        assert edit["path"] == "/workspace/calc/ops.py" and "def add" in edit["old_str"]
        for action in actions:
            _, reward, done, _, info = await env.astep(action)
        assert done and reward == 1.0, info["report"]


@pytest.mark.parametrize("mode", ["tools", "bash"])
async def test_a_sed_demonstration_edits_by_line_number_and_solves_the_task(
    swe_sample: Any, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """demo_edit=sed: one ``sed -i '<line><demo_sed>' <path>`` (checked against the gold line
    first); a demo_sed that does not give the gold line falls back to the editor, saying so."""
    cases = [("s/a - b/a + b/", True, None), ("s/a - b/b + a/", False, None)]
    if mode == "tools":  # without the editor offered, the fallback is git apply
        cases.append(("s/a - b/b + a/", False, ["bash", "submit"]))
    for expr, uses_sed, tools in cases:
        sample = swe_sample(mode=mode, demo_edit="sed", demo_sed=expr, tool_names=tools)
        async with demonstrated(sample) as (env, _, actions):
            fix = str(actions[1].tool_calls[0].arguments if mode == "tools" else actions[1].text)
            assert (f"sed -i '2{expr}' calc/ops.py" in fix) is uses_sed, fix
            if not uses_sed:
                assert "does not give the gold patch's lines" in caplog.text
            if tools:
                assert "git apply" in fix and {a.tool_calls[0].name for a in actions} <= {*tools}
            for action in actions:
                _, reward, done, _, info = await env.astep(action)
            assert done and reward == 1.0, info["report"]


async def test_swe_rollout_stats_times_each_oracle_call_and_the_grading(swe_sample: Any) -> None:
    """scripts/swe_rollout_stats.py: one oracle episode's calls are timed one by one in the
    episode's own sandbox, the last step (submit) is the grading, and the shapes it prints
    are quantiles of what it timed."""
    from agentrl.env import make_env
    from tests.script_module import load_script

    stats = load_script("swe_rollout_stats")
    env = make_env(swe_sample().env_id, **swe_sample().env_kwargs).unwrapped
    try:
        calls, grade, n = await stats.episode(env, 0)
    finally:
        await env.aclose()
    assert n == len(calls) == 2  # the failing tests' run, the editor's fix (then submit)
    assert all(c > 0 for c in calls) and grade > 0
    s = stats.shape([0.01, 0.02, 0.03, 0.5, 2.0])
    assert (s["p50"], s["p90"], s["max"]) == (0.03, 2.0, 2.0)
    assert s["lognormal_sigma"] > 0 and s["lognormal_p99"] > s["p90"]
