"""Guess the number: a multi-turn game driven by the env's "too high" / "too low" replies.

    obs: "Guess my number between 1 and 16. Reply with a number."
    assistant "8"  -> user "Too low."
    assistant "12" -> user "Too high."
    assistant "10" -> user "Correct!"    terminated, reward = 1 - turn_penalty * (turns - 1) / max_turns

The last integer in the assistant's text is the guess; a reply without one costs a turn and
gets "Reply with a number.". Running out of ``max_turns`` ends the game (terminated: the game
is over, not cut short) with reward 0. ``demonstration()`` plays binary search, which always
wins within ceil(log2(high - low + 1)) + 1 turns; ``max_turns`` defaults to that.
"""

from __future__ import annotations

import math
import re
from typing import Any

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.types import Message

_INT = re.compile(r"-?\d+")


class GuessNumberEnv(Env):
    """Find a secret integer in [low, high] from higher/lower feedback.

    Args:
        low, high: the range of the secret (inclusive).
        max_turns: guesses allowed (default: enough for binary search).
        turn_penalty: how much of the reward the extra turns can take away (0: none).
    """

    def __init__(
        self,
        *,
        low: int = 1,
        high: int = 16,
        max_turns: int | None = None,
        turn_penalty: float = 0.5,
    ):
        if high <= low:
            raise ConfigError(f"GuessNumberEnv needs high > low, got low={low}, high={high}")
        if not 0.0 <= turn_penalty < 1.0:
            raise ConfigError(f"turn_penalty must be in [0, 1), got {turn_penalty}")
        self.low, self.high = low, high
        self.max_turns = max_turns or math.ceil(math.log2(high - low + 1)) + 1
        if self.max_turns < 2:
            raise ConfigError(f"max_turns must be >= 2, got {self.max_turns}")
        self.turn_penalty = turn_penalty
        self.secret: int | None = None
        self.turns = 0

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        await super().areset(seed=seed)
        secret = (options or {}).get("secret")
        self.secret = (
            int(secret)
            if secret is not None
            else int(self.np_random.integers(self.low, self.high + 1))
        )
        self.turns = 0
        prompt = f"Guess my number between {self.low} and {self.high}. Reply with a number."
        return [Message(role="user", content=prompt)], {"max_turns": self.max_turns}

    def task_key(self, observation: Observation, info: Info) -> str:
        """The secret (every game shows the same prompt)."""
        return f"secret {self.secret} in {self.low}..{self.high}"

    def _feedback(self, text: str) -> tuple[str, bool]:
        found = _INT.findall(text)
        if not found:
            return "Reply with a number.", False
        guess = int(found[-1])
        if self.secret is None:
            raise ConfigError("GuessNumberEnv.step() called before reset()")
        if guess < self.secret:
            return "Too low.", False
        if guess > self.secret:
            return "Too high.", False
        return "Correct!", True

    async def astep(self, action: Message) -> StepResult:
        self.turns += 1
        reply, won = self._feedback(action.text)
        info: Info = {"turns": self.turns, "won": won}
        if won:
            reward = 1.0 - self.turn_penalty * (self.turns - 1) / self.max_turns
            return [Message(role="user", content=reply)], reward, True, False, info
        if self.turns >= self.max_turns:
            return [Message(role="user", content=f"{reply} Game over.")], 0.0, True, False, info
        return [Message(role="user", content=reply)], 0.0, False, False, info

    def demonstration(self) -> list[Message] | None:
        if self.secret is None:
            return None
        lo, hi = self.low, self.high
        out: list[Message] = []
        for _ in range(self.max_turns):
            guess = (lo + hi) // 2
            out.append(Message(role="assistant", content=str(guess)))
            if guess == self.secret:
                out.append(Message(role="user", content="Correct!"))
                return out
            if guess < self.secret:
                lo = guess + 1
                out.append(Message(role="user", content="Too low."))
            else:
                hi = guess - 1
                out.append(Message(role="user", content="Too high."))
        return None  # max_turns was set below what binary search needs
