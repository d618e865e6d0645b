"""``GymTextEnv``: an unmodified Gymnasium env with text observations and actions, as an agentrl
``Env`` (each observation a user message, the assistant's text the action).

    env = GymTextEnv("MyTextGame-v0", instructions="Reply with one word.")
    register_env("games/MyTextGame-v0", GymTextEnv, env=MyTextGame, instructions="...")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agentrl.env import Info, Observation, StepResult, SyncEnv
from agentrl.errors import ConfigError
from agentrl.types import Message


class GymTextEnv(SyncEnv):
    """Run an unmodified ``gymnasium.Env`` whose observations and actions are text.

    Each text observation becomes a user message (the first one prefixed with
    ``instructions``); the assistant's text, passed through ``parse_action``, is the action.
    An action the inner env's ``action_space`` rejects is not sent to it: the model gets
    ``"Invalid action ..."`` back with reward ``invalid_action_reward`` and may try again.
    The inner env's methods are sync, so this is a ``SyncEnv`` (they run inline).

        env = GymTextEnv("MyTextGame-v0", instructions="Reply with one word.")
        env = GymTextEnv(MyTextGame(), parse_action=str.lower)
        register_env("games/MyTextGame-v0", GymTextEnv, env=MyTextGame, instructions="...")

    Args:
        env: a ``gymnasium.Env``, a Gymnasium id for ``gymnasium.make``, or a class/factory
            that builds one (so a registration can name it).
        instructions: text put before the first observation.
        parse_action: assistant text -> inner action (default: the stripped text).
        format_observation: inner observation -> text (default: ``str``).
        invalid_action_reward: reward for an action outside the inner action space.
        make_kwargs: passed to ``gymnasium.make`` (an id) or to the class/factory.
    """

    def __init__(
        self,
        env: gym.Env[Any, Any] | str | Callable[..., gym.Env[Any, Any]],
        *,
        instructions: str = "",
        parse_action: Callable[[str], Any] | None = None,
        format_observation: Callable[[Any], str] = str,
        invalid_action_reward: float = 0.0,
        **make_kwargs: Any,
    ) -> None:
        if isinstance(env, gym.Env):
            if make_kwargs:
                raise ConfigError(
                    f"GymTextEnv got make kwargs {sorted(make_kwargs)} with an env object; "
                    "pass them only with a Gymnasium id or an env class"
                )
            inner = env
        elif isinstance(env, str):
            inner = gym.make(env, **make_kwargs)
        else:
            inner = env(**make_kwargs)
            if not isinstance(inner, gym.Env):
                raise ConfigError(
                    f"GymTextEnv: {env!r} built a {type(inner).__name__}, not a gymnasium.Env"
                )
        self.env = inner
        self.instructions = instructions
        self.parse_action = parse_action or str.strip
        self.format_observation = format_observation
        self.invalid_action_reward = invalid_action_reward
        spec = inner.spec
        self.nondeterministic = bool(spec is not None and spec.nondeterministic)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed, options=options)
        text = self.format_observation(obs)
        if self.instructions:
            text = f"{self.instructions}\n{text}"
        return [Message(role="user", content=text)], dict(info)

    def step(self, action: Message) -> StepResult:
        try:
            inner = self.parse_action(action.text)
            valid = self.env.action_space.contains(inner)
        except Exception:  # a parse failure is the model's mistake, not the env's
            valid = False
        if not valid:
            msg = f"Invalid action {action.text.strip()[:80]!r}."
            return (
                [Message(role="user", content=msg)],
                self.invalid_action_reward,
                False,
                False,
                {"invalid_action": True},
            )
        obs, reward, terminated, truncated, info = self.env.step(inner)
        observation = [Message(role="user", content=self.format_observation(obs))]
        return observation, float(reward), bool(terminated), bool(truncated), dict(info)

    def close(self) -> None:
        self.env.close()
