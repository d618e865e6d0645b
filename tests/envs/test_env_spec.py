"""Env ids parse as ns/Name-vN, misses name the versions that exist, make attaches a spec."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from gymnasium.envs.registration import EnvSpec

from agentrl.env import ENVS, MaxTurns, make_env, register_env
from agentrl.env_spec import EnvId, parse_env_id
from agentrl.errors import ConfigError, DuplicateIdError, UnknownEnvError
from agentrl.splits import split_of
from agentrl.types import Message


@pytest.fixture
def versions() -> Iterator[None]:
    """test-spec/Guess-v0 and -v2 (no v1), the second with a step limit."""
    register_env("test-spec/Guess-v0", "envs.guess:GuessNumberEnv", high=8)
    register_env("test-spec/Guess-v2", "envs.guess:GuessNumberEnv", high=99, max_episode_steps=2)
    yield
    for env_id in ("test-spec/Guess-v0", "test-spec/Guess-v2"):
        ENVS.unregister(env_id)


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_ids_parse_as_namespace_name_version() -> None:
    assert parse_env_id("games/GuessNumber-v0") == EnvId("games", "GuessNumber", 0)
    assert parse_env_id("test-agents/Calc.v2-x-v12") == EnvId("test-agents", "Calc.v2-x", 12)
    assert str(EnvId("a", "B", 3)) == "a/B-v3" and EnvId("a", "B", 3).base == "a/B"
    for bad in ("GuessNumber-v0", "games/GuessNumber", "games/GuessNumber-v", "a/b/C-v0", ""):
        with pytest.raises(ConfigError, match=r"malformed: env ids look like 'namespace/Name-vN'"):
            parse_env_id(bad)


def test_a_malformed_id_is_refused_at_registration() -> None:
    with pytest.raises(ConfigError, match=r"'Guess' is malformed.*'namespace/Name-vN'"):
        register_env("Guess", "envs.guess:GuessNumberEnv")
    with pytest.raises(ConfigError, match="max_episode_steps must be >= 1"):
        register_env("test-spec/Bad-v0", "envs.guess:GuessNumberEnv", max_episode_steps=0)
    assert "Guess" not in ENVS and "test-spec/Bad-v0" not in ENVS


def test_a_missing_version_names_the_versions_that_exist(versions: None) -> None:
    with pytest.raises(UnknownEnvError) as exc:
        make_env("test-spec/Guess-v1")
    msg = str(exc.value)
    assert msg.startswith("test-spec/Guess-v1 does not exist; available versions: v0, v2.")
    assert "Did you mean 'test-spec/Guess-v2' or 'test-spec/Guess-v0'?" in msg
    assert exc.value.suggestions == ["test-spec/Guess-v2", "test-spec/Guess-v0"]
    with pytest.raises(
        UnknownEnvError, match=r"^arith/Calculator-v1 does not exist; available versions: v0\."
    ):
        make_env("arith/Calculator-v1")


def test_an_id_without_a_version_or_malformed_says_the_form(versions: None) -> None:
    with pytest.raises(UnknownEnvError) as exc:
        make_env("test-spec/Guess")
    assert "'test-spec/Guess' has no version" in str(exc.value)
    assert "available versions: v0, v2" in str(exc.value)
    with pytest.raises(UnknownEnvError, match=r"'Calculator' is malformed: .*'namespace/Name-vN'"):
        make_env("Calculator")
    with pytest.raises(UnknownEnvError, match=r"^no env 'games/GesNumber-v0'\. Did you mean"):
        make_env("games/GesNumber-v0")  # a misspelt name: spelling suggestions as before


def test_make_attaches_the_spec(versions: None) -> None:
    env = make_env("test-spec/Guess-v0", turn_penalty=0.25)
    spec = env.spec
    assert isinstance(spec, EnvSpec)
    assert (spec.id, spec.namespace, spec.name, spec.version) == (
        "test-spec/Guess-v0",
        "test-spec",
        "Guess",
        0,
    )
    assert spec.entry_point == "envs.guess:GuessNumberEnv"
    assert spec.kwargs == {"high": 8, "turn_penalty": 0.25}  # defaults, then the overrides
    assert spec.max_episode_steps is None and spec.nondeterministic is False
    assert make_env("test-spec/Guess-v0").spec.kwargs == {"high": 8}  # a fresh spec per env
    builtin = make_env("arith/Calculator-v0").spec
    assert builtin is not None and builtin.entry_point == "envs.countdown:CalculatorEnv"


def test_max_episode_steps_wraps_in_max_turns_and_is_in_the_spec(versions: None) -> None:
    env = make_env("test-spec/Guess-v2")
    assert isinstance(env, MaxTurns) and env.max_turns == 2
    assert env.spec is env.unwrapped.spec and env.spec.max_episode_steps == 2
    env.reset(options={"secret": 50})
    assert env.step(say("1"))[3] is False
    _, _, terminated, truncated, info = env.step(say("2"))
    assert (terminated, truncated, info["truncated_by"]) == (False, True, "max_turns")
    # the wrapper keeps what the kernel reads from the env: the task key of the split
    obs, info = asyncio.run(env.areset(options={"secret": 7}))
    assert env.task_key(obs, info) == "secret 7 in 1..99"
    assert split_of(env.task_key(obs, info)) in ("train", "eval")


def test_registering_again_with_another_step_limit_is_a_duplicate(versions: None) -> None:
    register_env("test-spec/Guess-v2", "envs.guess:GuessNumberEnv", high=99, max_episode_steps=2)
    with pytest.raises(DuplicateIdError, match="different max_episode_steps: 2 and 3"):
        register_env(
            "test-spec/Guess-v2", "envs.guess:GuessNumberEnv", high=99, max_episode_steps=3
        )
    assert ENVS.max_episode_steps("test-spec/Guess-v2") == 2
