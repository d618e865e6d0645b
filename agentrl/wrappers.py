"""Env wrappers: an ``Env`` around an ``Env`` that changes when an episode ends.

    env = MaxTurns(make_env("games/GuessNumber-v0"), max_turns=4)   # truncated after 4 steps
    env = TimeLimit(env, seconds=60.0)                              # truncated after 60 s of wall time

A wrapper forwards everything it does not change (``tools``, ``nondeterministic``,
``demonstration()``, ``task_key``, the spaces, ``spec``, ``np_random``, other attributes) to the
wrapped env. Like any ``Env`` it implements ``areset``/``astep``/``aclose`` (calling the wrapped
env's) and hooks ``on_reset``/``on_step``; ``reset``/``step`` from sync code run the async ones.

``EnvWrapper`` and ``MaxTurns`` are defined in ``agentrl/env.py``, because ``make_env`` applies
``MaxTurns`` for an id registered with ``max_episode_steps``; they are importable from here too.

Truncation is reported the Gymnasium way: ``truncated=True`` plus ``info["truncated_by"]``
(``"max_turns"`` or ``"time_limit"``); a step that already terminated is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentrl.env import Env, EnvWrapper, MaxTurns, StepResult, truncate
from agentrl.errors import ConfigError
from agentrl.types import Message

logger = logging.getLogger(__name__)


class TimeLimit(EnvWrapper):
    """Truncate an episode once ``seconds`` of wall time have passed since reset.

    Async steps are cancelled when they run past the limit and return an empty observation,
    reward 0 and ``truncated=True``. A ``SyncEnv``'s step runs inline and cannot be
    interrupted; it is truncated when it returns late. ``clock`` is injectable for tests.
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
        return truncate(result, "time_limit") if self.remaining_s <= 0 else result

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


__all__ = ["EnvWrapper", "MaxTurns", "TimeLimit"]
