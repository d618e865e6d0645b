"""Every built-in env passes the checker, its demonstration solves it, and its reward is right."""

from __future__ import annotations

import pytest

from agentrl.env import ENVS, Env, make_env
from agentrl.env_checker import check_env, replay_demonstration
from agentrl.types import Message, ToolCall

NEEDS_SETUP = {
    "swe/Repo-v0",  # prepared repositories first; tests/agents/test_swe_agent.py
    "gui/Browser-v0",  # chromium; checked in tests/gui/test_browser_env.py (-m browser)
}
BUILTIN = [s.id for s in ENVS if s.entry_point_str.startswith("envs.") and s.id not in NEEDS_SETUP]


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(expression: str, id: str = "c1") -> Message:
    tc = ToolCall(name="calculator", arguments={"expression": expression}, id=id)
    return Message(role="assistant", content="", tool_calls=(tc,))


def test_the_builtin_envs_are_registered() -> None:
    assert {
        "reasoning/Task-v0",
        "reasoning/BasicArithmetic-v0",
        "reasoning/ChainSum-v0",
        "reasoning/LegCounting-v0",
        "arith/Calculator-v0",
        "arith/Countdown-v0",
        "games/GuessNumber-v0",
        "games/GridWorld-v0",
    } <= set(BUILTIN)


@pytest.mark.parametrize("env_id", BUILTIN)
def test_builtin_env_passes_the_checker(env_id: str) -> None:
    report = check_env(env_id, seeds=(0, 1, 2))
    assert report.passed, str(report)
    assert {r.name for r in report.results if not r.skipped} >= {
        "reset",
        "step",
        "demonstration",
        "gymnasium",
    }


@pytest.mark.parametrize("env_id", BUILTIN)
def test_demonstration_solves_many_seeds_with_full_reward(env_id: str) -> None:
    env = make_env(env_id)
    for seed in range(20):
        env.reset(seed=seed)
        demo = env.demonstration()
        assert demo is not None
        env.reset(seed=seed)
        assert replay_demonstration(env, demo) is None
    env.reset(seed=3)
    *_, last = [env.step(m) for m in env.demonstration() or [] if m.role == "assistant"]
    assert last[1] > 0.5


@pytest.mark.parametrize(
    ("task", "kwargs"),
    [
        ("basic_arithmetic", {}),
        ("chain_sum", {}),
        ("leg_counting", {"task_config": {"max_animals": 3}}),
    ],
)
def test_reasoning_tasks_score_answers_offline(task: str, kwargs: dict) -> None:
    env = make_env("reasoning/Task-v0", task=task, **kwargs)
    obs, info = env.reset(seed=5)
    assert obs[0].content.endswith("End with 'Answer: <value>'.") and info["task"] == task
    gold = env.dataset[info["index"]]["answer"]
    assert env.step(say(f"Answer: {gold}"))[1] == 1.0
    env.reset(seed=5)
    assert env.step(say(f"<answer>{gold}</answer>"))[1] == 1.0
    env.reset(seed=5)
    _, reward, terminated, _, info = env.step(say(f"{gold}"))  # no answer marker: no credit
    assert (reward, terminated, info["extracted"]) == (0.0, True, None)
    env.reset(options={"index": 0})
    assert env.entry == env.dataset[0]


def test_calculator_reward_requires_using_the_tool() -> None:
    env = make_env("arith/Calculator-v0")
    obs, _ = env.reset(seed=0)
    expr = env.expression
    value = env.value
    assert obs[0].content == f'Compute "{expr}" with the calculator.'
    # a correct answer without the tool earns nothing
    assert env.step(say(f"Answer: {value}"))[1] == 0.0
    # tool, then the right answer: full reward
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(call(expr))
    assert (obs[0].role, obs[0].content, obs[0].tool_call_id) == ("tool", value, "c1")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.step(say(f"Answer: {value}"))[1] == 1.0
    # tool used right, answer wrong: partial credit
    env.reset(seed=0)
    env.step(call(expr))
    assert env.step(say("Answer: 1"))[1] == pytest.approx(0.2)
    # a tool error is an observation, not a crash; turns run out -> truncated
    env = make_env("arith/Calculator-v0", max_turns=2)
    env.reset(seed=1)
    obs, *_ = env.step(call("2 +"))
    assert obs[0].content.startswith("Error: ValueError: invalid expression")
    assert env.step(call("1 + 1"))[3] is True


async def test_calculator_reward_when_the_agent_runs_the_tools() -> None:
    """ToolAgentLoop-style: tools run through the ToolSet with env= injected, the env sees only the answer."""
    env = make_env("arith/Calculator-v0", digits=1, terms=3, ops=["+", "*"])
    await env.areset(seed=4)
    assert env.tools is not None
    tc = ToolCall(name="calculator", arguments={"expression": env.expression})
    result = await env.tools.call(tc, env=env, sample=None)
    assert result.content == env.value
    _, reward, terminated, _, _ = await env.astep(say(f"Answer: {result.content}"))
    assert (reward, terminated) == (1.0, True)


def test_countdown_checks_numbers_and_verification() -> None:
    env = make_env("arith/Countdown-v0")
    env.reset(seed=2)
    nums, target, solution = env.numbers, env.target, env.solution
    assert sorted(
        int(n) for n in solution.replace("+", " ").replace("-", " ").replace("*", " ").split()
    ) == sorted(nums)
    _, reward, _, _, info = env.step(say(f"Answer: {solution}"))  # right but unverified
    assert reward == 0.5 and info["verified"] is False
    env.reset(seed=2)
    env.step(call(solution))
    assert env.step(say(f"Answer: {solution}"))[1] == 1.0
    env.reset(seed=2)
    _, reward, _, _, info = env.step(say(f"Answer: {target} + 0 * 99"))  # numbers not given
    assert reward == 0.0


def test_guess_number_feedback_win_and_loss() -> None:
    env = make_env("games/GuessNumber-v0")
    obs, info = env.reset(options={"secret": 11})
    assert "between 1 and 16" in obs[0].content and info["max_turns"] == 5
    assert env.step(say("8"))[0][0].content == "Too low."
    assert env.step(say("I say 13"))[0][0].content == "Too high."
    assert env.step(say("hmm"))[0][0].content == "Reply with a number."
    obs, reward, terminated, truncated, info = env.step(say("11"))
    assert (obs[0].content, terminated, truncated, info["won"]) == ("Correct!", True, False, True)
    assert reward == pytest.approx(1.0 - 0.5 * 3 / 5)
    env.reset(options={"secret": 1})
    results = [env.step(say("16")) for _ in range(5)]
    assert [r[2] for r in results] == [False] * 4 + [True]
    assert results[-1][0][0].content == "Too high. Game over." and results[-1][1] == 0.0


def test_envs_accept_difficulty_knobs() -> None:
    env: Env = make_env("arith/Calculator-v0", digits=3, terms=3, ops=["+"])
    env.reset(seed=0)
    parts = env.expression.split()  # type: ignore[attr-defined]
    assert len(parts) == 5 and all(len(p) == 3 for p in parts[::2]) and parts[1] == "+"
    env = make_env("games/GuessNumber-v0", high=100)
    assert env.reset(seed=0)[1]["max_turns"] == 8


def test_grid_world_moves_walls_and_loss() -> None:
    env = make_env("games/GridWorld-v0", size=3, walls=0, max_turns=3)
    env.reset(seed=0)
    env.start = env.pos = (0, 0)  # type: ignore[attr-defined]
    env.goal = (2, 2)  # type: ignore[attr-defined]
    obs, reward, terminated, _, _ = env.step(say("I go up"))
    assert obs[0].content.startswith("Blocked.\n#####\n#A..#") and (reward, terminated) == (
        0.0,
        False,
    )
    obs, *_ = env.step(say("dunno"))
    assert obs[0].content == "Reply up, down, left or right."
    obs, reward, terminated, _, info = env.step(say("RIGHT"))
    assert env.pos == (0, 1)  # type: ignore[attr-defined]
    assert obs[0].content.endswith("Game over.") and (reward, terminated, info["won"]) == (
        0.0,
        True,
        False,
    )


def test_calculator_rejects_model_text_without_a_syntax_warning() -> None:
    import warnings

    from envs.countdown import evaluate

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SyntaxWarning would print on every run's stderr
        for text in ("2and 3", "3if 1 else 2", "1_ + 2"):
            with pytest.raises(ValueError, match="invalid expression"):
                evaluate(text)
    assert evaluate("(3 + 5) * 2") == 16
