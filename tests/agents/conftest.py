"""Small envs, templates and fake generators for AgentLoop tests."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import Env, register_env
from agentrl.inference.launch import ServerProcess
from agentrl.tiny import build_tokenizer
from agentrl.tool import ToolSet
from agentrl.types import Message, system, user
from tests.envs.swe_repo import env, repo, repo_test_env  # noqa: F401 (SWE fixtures)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "(3 + 4) * 5".
    """
    if not re.fullmatch(r"[\d\s+\-*/().]+", expression):
        raise ValueError(f"bad expression {expression!r}")
    return str(eval(expression))


class CalcEnv(Env):
    """Ask for 12 * 7; the answer (a reply without tool calls) is scored once."""

    tools = ToolSet([calculator])

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return [system("Use the calculator."), user("What is 12 * 7?")], {}

    async def astep(self, action: Message) -> Any:
        ok = "84" in action.text
        return [], float(ok), True, False, {"success": ok}


class GuessEnv(Env):
    """Guess a number in 1..9 (target = seed); 'higher'/'lower' hints; up to the loop's limits."""

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.target = seed if seed is not None else 5
        return [user("Guess my number between 1 and 9.")], {}

    async def astep(self, action: Message) -> Any:
        m = re.search(r"\d+", action.text)
        guess = int(m.group()) if m else -1
        if guess == self.target:
            return [user("Correct!")], 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return [user(f"Wrong, go {hint}.")], 0.0, False, False, {}


class ToolGuessEnv(GuessEnv):
    """GuessEnv that also shows a tool, so replies are parsed for tool calls."""

    tools = ToolSet([calculator])


register_env("test-agents/Calc-v0", CalcEnv)
register_env("test-agents/Guess-v0", GuessEnv)
register_env("test-agents/ToolGuess-v0", ToolGuessEnv)


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_tokenizer()


@pytest.fixture(scope="session")
def chatml(tokenizer) -> ChatTemplate:  # type: ignore[no-untyped-def]
    return ChatTemplate(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):  # type: ignore[no-untyped-def]
    from agentrl.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def server(tiny_model_path: Path) -> Iterator[ServerProcess]:
    """An embedded server on the tiny model, one per test module (the gateway tests)."""
    cfg = ServerProcess.Config(model=str(tiny_model_path), max_batch_size=8, num_threads=1)
    with ServerProcess(cfg) as proc:
        yield proc
