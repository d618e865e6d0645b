"""The env checker catches broken envs and respects nondeterministic ones."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentrl.env import Env, SyncEnv
from agentrl.env_checker import EnvCheckReport, check_env, check_env_cli, list_envs
from agentrl.errors import EnvCheckError, EnvError, UnknownEnvError
from agentrl.tool import ToolSet, tool
from agentrl.types import Message
from agentrl.wrappers import MaxTurns


class Good(Env):
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        self.n = int(self.np_random.integers(100))
        return [Message(role="user", content=f"Say {self.n}.")], {}

    async def astep(self, action: Message):
        return [], float(action.text == str(self.n)), True, False, {}

    def demonstration(self) -> list[Message]:
        return [Message(role="assistant", content=str(self.n))]


class Unseeded(Good):
    """Draws its task from the global RNG: the same seed gives different tasks."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        self.n = random.randint(0, 10**9)
        return [Message(role="user", content=f"Say {self.n}.")], {}


class DeclaredNondeterministic(Unseeded):
    nondeterministic = True


class HiddenUnseeded(Env):
    """The prompt never changes, but the secret behind it ignores the seed."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        self.secret = random.randint(0, 10**9)
        return [Message(role="user", content="Guess my number.")], {}

    async def astep(self, action: Message):
        hint = f"it is not {self.secret % 997}"  # reveals the hidden state
        return [Message(role="user", content=hint)], 0.0, False, False, {}


class HiddenUnseededWithDemo(HiddenUnseeded):
    async def astep(self, action: Message):
        return [], float(action.text == str(self.secret)), True, False, {}

    def demonstration(self) -> list[Message]:
        return [Message(role="assistant", content=str(self.secret))]


class LaterStepsUnseeded(Good):
    """Same task per seed, but from the second step on the replies use the global RNG."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.turn = 0
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: Message):
        self.turn += 1
        if self.turn < 2:
            return [Message(role="user", content="again")], 0.0, False, False, {}
        return [Message(role="user", content=str(random.random()))], 0.0, self.turn > 4, False, {}


class NanReward(Good):
    async def astep(self, action: Message):
        return [], float("nan"), True, False, {}


class TextObservation(Good):
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        return "hello", {}  # type: ignore[return-value]


class WrongDemo(Good):
    def demonstration(self) -> list[Message]:
        return [Message(role="assistant", content="-1")]


class SyncGood(SyncEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(100))
        return [Message(role="user", content=f"Say {self.n}.")], {}

    def step(self, action: Message):
        return [], float(action.text == str(self.n)), True, False, {}


class AsyncDisagrees(SyncGood):
    """A SyncEnv whose astep does not run its step."""

    async def astep(self, action: Message):
        return [], 0.5, True, False, {}


@tool
def helper(x: int) -> int:
    """Double x."""
    return 2 * x


@tool(name="bad name!")
def badly_named(x: int) -> int:
    """Has a name the OpenAI API rejects."""
    return x


class BadTools(Good):
    tools = ToolSet([helper, badly_named])


def failed(report: EnvCheckReport) -> dict[str, str]:
    return {r.name: r.message for r in report.failed}


@pytest.mark.parametrize("cls", [Good, SyncGood])
def test_a_good_env_passes_every_check(cls: type[Env]) -> None:
    report = check_env(cls())
    assert report.passed, str(report)
    assert [r.name for r in report.results] == [
        "spaces",
        "reset",
        "determinism",
        "step",
        "tools",
        "demonstration",
        "sync_async",
        "gymnasium",
    ]
    assert "passed" in str(report)


def test_unseeded_randomness_fails_determinism() -> None:
    report = check_env(Unseeded())
    assert "determinism" in failed(report) and "self.np_random" in failed(report)["determinism"]
    assert "sync_async" in failed(report)


def test_nondeterministic_envs_skip_determinism_checks() -> None:
    report = check_env(DeclaredNondeterministic())
    assert report.passed, str(report)
    skipped = {r.name for r in report.results if r.skipped}
    assert {"determinism", "sync_async"} <= skipped
    assert check_env(Unseeded(), skip_determinism=True).passed
    assert check_env(
        MaxTurns(DeclaredNondeterministic(), max_turns=5)
    ).passed  # wrappers forward the flag


@pytest.mark.parametrize(
    ("env", "text"),
    [
        (HiddenUnseeded(), "differ at step 1"),  # same prompt, different hidden state
        (HiddenUnseededWithDemo(), "different demonstrations"),
        (LaterStepsUnseeded(), "differ at step 2"),
    ],
)
def test_hidden_state_that_ignores_the_seed_fails_determinism(env: Env, text: str) -> None:
    det = failed(check_env(env, skip_determinism=False)).get("determinism", "")
    assert text in det and "self.np_random" in det, det


def test_declared_nondeterministic_hidden_state_passes() -> None:
    class Declared(HiddenUnseededWithDemo):
        nondeterministic = True

    report = check_env(Declared())
    assert report.passed, str(report)
    assert "determinism" in {r.name for r in report.results if r.skipped}


def test_check_env_cli_passes_env_kwargs() -> None:
    report = check_env_cli("games/GuessNumber-v0", {"high": 7})
    assert report.passed, str(report)
    with pytest.raises(TypeError):
        check_env_cli("games/GuessNumber-v0", {"no_such_kwarg": 1})


@pytest.mark.parametrize(
    ("env", "check", "text"),
    [
        (NanReward(), "step", "finite float"),
        (TextObservation(), "reset", "list[Message]"),
        (WrongDemo(), "demonstration", "ended with reward 0.0"),
        (AsyncDisagrees(), "sync_async", "step and astep disagree"),
        (BadTools(), "tools", "'bad name!' must be unique and match"),
    ],
)
def test_broken_envs_fail_the_right_check(env: Env, check: str, text: str) -> None:
    report = check_env(env)
    assert not report.passed
    assert check in failed(report), str(report)
    assert text in failed(report)[check]


def test_raise_on_failure() -> None:
    with pytest.raises(EnvCheckError, match="NanReward failed") as exc:
        check_env(NanReward(), raise_on_failure=True)
    assert isinstance(exc.value, EnvError)


def test_unknown_id_says_did_you_mean() -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean 'arith/Calculator-v0'"):
        check_env_cli("arith/Calculater-v0")


async def test_check_env_works_inside_a_running_event_loop() -> None:
    report = check_env("games/GuessNumber-v0")
    assert report.passed, str(report)


def test_list_envs_for_the_cli() -> None:
    rows = {row[0]: row for row in list_envs()}
    assert rows["arith/Calculator-v0"][1] == "envs.countdown:CalculatorEnv"
    assert "calculator" in rows["arith/Calculator-v0"][2]
    assert check_env_cli("reasoning/ChainSum-v0").passed
