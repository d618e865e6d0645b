"""Env wrappers: an ``Env`` around an ``Env`` that changes when an episode ends.

    env = MaxTurns(make_env("games/GuessNumber-v0"), max_turns=4)   # truncated after 4 steps
    env = TimeLimit(env, seconds=60.0)                              # truncated after 60 s of wall time

A wrapper forwards everything it does not change (``tools``, ``nondeterministic``,
``demonstration()``, the spaces, ``np_random``, other attributes) to the wrapped env, and keeps
the sync and async APIs separate: ``reset``/``step`` call the inner env's sync methods and
``areset``/``astep`` its async ones, so a wrapper never adds an event loop.

Truncation is reported the Gymnasium way: ``truncated=True`` plus ``info["truncated_by"]``
(``"max_turns"`` or ``"time_limit"``); a step that already terminated is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.tool import ToolSet
from agentrl.types import Message

logger = logging.getLogger(__name__)


class EnvWrapper(Env):
    """Base class for wrappers: override ``on_reset`` / ``on_step`` (both sync and async use them)."""

    def __init__(self, env: Env) -> None:
        if not isinstance(env, Env):
            raise ConfigError(
                f"{type(self).__name__} wraps an agentrl Env, got {type(env).__name__}"
            )
        self.env = env

    # --- forwarded attributes ---------------------------------------------------------------
    @property  # type: ignore[override, misc]
    def tools(self) -> ToolSet | None:  # type: ignore[override]
        return self.env.tools

    @property  # type: ignore[misc]
    def nondeterministic(self) -> bool:  # type: ignore[override]
        return self.env.nondeterministic

    @property  # type: ignore[override, misc]
    def observation_space(self) -> gym.spaces.Space[Any]:  # type: ignore[override]
        return self.env.observation_space

    @property  # type: ignore[override, misc]
    def action_space(self) -> gym.spaces.Space[Any]:  # type: ignore[override]
        return self.env.action_space

    @property
    def unwrapped(self) -> Env:  # type: ignore[override]
        return self.env.unwrapped  # type: ignore[return-value]

    @property  # type: ignore[override, misc]
    def spec(self) -> Any:  # type: ignore[override]
        return self.env.spec

    @spec.setter
    def spec(self, value: Any) -> None:
        self.env.spec = value

    @property  # type: ignore[override, misc]
    def np_random(self) -> Any:
        return self.env.np_random

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def demonstration(self) -> list[Message] | None:
        return self.env.demonstration()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{self.env!r}>"

    # --- hooks ----------------------------------------------------------------------------
    def on_reset(self) -> None:
        """Called after every reset of the inner env."""

    def on_step(self, result: StepResult) -> StepResult:
        """Called with every step result of the inner env; returns the (changed) result."""
        return result

    # --- sync and async twins -------------------------------------------------------------
    def reset(  # type: ignore[override]
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        out = self.env.reset(seed=seed, options=options)
        self.on_reset()
        return out

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        out = await self.env.areset(seed=seed, options=options)
        self.on_reset()
        return out

    def step(self, action: Message) -> StepResult:  # type: ignore[override]
        return self.on_step(self.env.step(action))

    async def astep(self, action: Message) -> StepResult:
        return self.on_step(await self.env.astep(action))

    def close(self) -> None:
        self.env.close()

    async def aclose(self) -> None:
        await self.env.aclose()


def _truncate(result: StepResult, by: str) -> StepResult:
    obs, reward, terminated, truncated, info = result
    if terminated or truncated:
        return result
    return obs, reward, False, True, {**info, "truncated_by": by}


class MaxTurns(EnvWrapper):
    """Truncate an episode after ``max_turns`` steps (``info["truncated_by"] == "max_turns"``)."""

    def __init__(self, env: Env, max_turns: int) -> None:
        if max_turns < 1:
            raise ConfigError(f"MaxTurns.max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def on_reset(self) -> None:
        self.turns = 0

    def on_step(self, result: StepResult) -> StepResult:
        self.turns += 1
        return _truncate(result, "max_turns") if self.turns >= self.max_turns else result


class TimeLimit(EnvWrapper):
    """Truncate an episode once ``seconds`` of wall time have passed since reset.

    Async steps are cancelled when they run past the limit and return an empty observation,
    reward 0 and ``truncated=True``. A sync step cannot be interrupted; it is truncated when it
    returns late. ``clock`` is injectable for tests.
    """

    def __init__(
        self, env: Env, seconds: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if seconds <= 0:
            raise ConfigError(f"TimeLimit.seconds must be > 0, got {seconds}")
        super().__init__(env)
        self.seconds = seconds
        self.clock = clock
        self.started_at = clock()

    @property
    def remaining_s(self) -> float:
        return self.seconds - (self.clock() - self.started_at)

    def on_reset(self) -> None:
        self.started_at = self.clock()

    def on_step(self, result: StepResult) -> StepResult:
        return _truncate(result, "time_limit") if self.remaining_s <= 0 else result

    async def astep(self, action: Message) -> StepResult:
        remaining = self.remaining_s
        if remaining <= 0:
            return [], 0.0, False, True, {"truncated_by": "time_limit"}
        try:
            result = await asyncio.wait_for(self.env.astep(action), timeout=remaining)
        except TimeoutError:
            logger.debug("step cancelled by TimeLimit after %.1fs", self.seconds)
            return [], 0.0, False, True, {"truncated_by": "time_limit"}
        return self.on_step(result)
