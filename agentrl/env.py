"""The Env contract: Gymnasium-shaped, async-first, speaking chat messages.

    obs, info = await env.areset(seed=s)                          # obs: list[Message]
    obs, reward, terminated, truncated, info = await env.astep(action)  # action: Message

An env owns the task, the world state and the reward. ``reset``/``step`` (sync) and
``areset``/``astep`` (async) are twins: implement whichever fits and the other works.
Envs are ``gymnasium.Env`` subclasses with ``MessagesSpace`` observation/action spaces, so
``gymnasium.utils.env_checker.check_env`` runs on them too (see ``agentrl/env_checker.py``).

Tool envs set ``tools`` (a ``ToolSet``); when an action carries tool calls, ``step`` runs them
with ``await self.acall_tools(action)`` and returns the tool messages as the observation; a
final text answer ends the episode with the reward. ``GymTextEnv`` runs a plain
``gymnasium.Env`` whose observations and actions are text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.errors import ConfigError, UnknownEnvError
from agentrl.registry import MODULES_HINT, Registry
from agentrl.spaces import MessagesSpace
from agentrl.tool import ToolSet
from agentrl.types import Message

Observation = list[Message]
Info = dict[str, Any]
StepResult = tuple[Observation, float, bool, bool, Info]


class Env(gym.Env[Observation, Message]):
    """Base class for agentrl environments. Subclass and implement ``reset``+``step`` or
    ``areset``+``astep``.

    Example::

        class Echo(Env):
            async def areset(self, *, seed=None, options=None):
                await super().areset(seed=seed)  # seeds self.np_random (sync envs: super().reset)
                return [user("say hi")], {}

            async def astep(self, action):
                return [], float("hi" in action.text), True, False, {}

    Class attributes:
      ``nondeterministic``: the same seed may not give the same episode (browsers, sandboxes);
      the checker skips its determinism checks.
      ``tools``: a ``ToolSet`` of tools the model may call in this env (shown to the model
      through the chat template), or None.

    ``observation_space`` / ``action_space`` default to ``MessagesSpace`` (the action space
    samples calls to ``tools``); assign your own in ``__init__`` to narrow them.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012
    nondeterministic: ClassVar[bool] = False
    tools: ToolSet | None = None
    _observation_space: gym.spaces.Space[Any] | None = None
    _action_space: gym.spaces.Space[Any] | None = None

    @property  # type: ignore[override]
    def observation_space(self) -> gym.spaces.Space[Any]:
        if self._observation_space is None:
            self._observation_space = MessagesSpace.observations()
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space: gym.spaces.Space[Any]) -> None:
        self._observation_space = space

    @property  # type: ignore[override]
    def action_space(self) -> gym.spaces.Space[Any]:
        if self._action_space is None:
            names = self.tools.names if self.tools is not None else ()
            self._action_space = MessagesSpace.actions(tool_names=names)
        return self._action_space

    @action_space.setter
    def action_space(self, space: gym.spaces.Space[Any]) -> None:
        self._action_space = space

    async def acall_tools(self, action: Message, **injected: Any) -> Observation:
        """Run the action's tool calls with ``self.tools``; one tool message per call.

        ``injected`` (e.g. ``sandbox=...``) reaches the tools that declare it; ``env=self``
        is always offered (AgentLoops that run tools themselves offer it too). Tool failures
        become error messages for the model; see ``agentrl.tool.ToolSet.call``.
        """
        injected.setdefault("env", self)
        if self.tools is None:
            return [
                Message(
                    role="tool",
                    content=f"Error: this environment has no tools; {tc.name!r} was not run.",
                    tool_call_id=tc.id,
                    name=tc.name,
                )
                for tc in action.tool_calls
            ]
        return await self.tools.run(action.tool_calls, **injected)

    # --- async API (what AgentLoops call) ---------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        if type(self).reset is not Env.reset and type(self).areset is Env.areset:
            return self.reset(seed=seed, options=options)  # a sync env
        if type(self).reset is Env.reset and type(self).areset is Env.areset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        # ``await super().areset(seed=seed)`` from a subclass: seed ``self.np_random``.
        gym.Env.reset(self, seed=seed)
        return [], {}

    async def astep(self, action: Message) -> StepResult:
        if type(self).step is Env.step:
            raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")
        return self.step(action)

    async def aclose(self) -> None:
        self.close()

    # --- sync API (Gymnasium) -------------------------------------------------------------
    def reset(  # type: ignore[override]
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        if type(self).areset is not Env.areset and type(self).reset is Env.reset:
            return _run_sync(self.areset(seed=seed, options=options))  # an async env
        if type(self).reset is Env.reset and type(self).areset is Env.areset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        # ``super().reset(seed=seed)`` from a subclass (the Gymnasium idiom): seed ``self.np_random``.
        gym.Env.reset(self, seed=seed)
        return [], {}

    def step(self, action: Message) -> StepResult:  # type: ignore[override]
        if type(self).astep is Env.astep:
            raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")
        return _run_sync(self.astep(action))

    def task_key(self, observation: Observation, info: Info) -> str:
        """What names the task just drawn by reset; its hash decides the train/eval split.

        Two resets with the same key are the same task, so a key must hold everything that
        tells tasks apart. The default is ``info["task_key"]`` when reset returns one, else
        the text of the reset observation (the prompt). Override it when tasks differ in
        hidden state behind the same prompt (a secret number, a repository's commit).
        See ``agentrl.splits``.
        """
        key = info.get("task_key")
        if key is not None:
            return str(key)
        return "\n".join(f"{m.role}: {m.text}" for m in map(Message.coerce, observation))

    def demonstration(self) -> list[Message] | None:
        """An oracle conversation solving the current episode (after reset), for SFT warm-up.

        Returns the messages the model should produce and see, starting after the reset
        observation, or None if this env has no oracle.
        """
        return None


def _run_sync(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    raise RuntimeError(
        "called a sync Env method from inside a running event loop; use areset()/astep() "
        "instead (inside areset(), seed with `await super().areset(seed=seed)`)"
    )


ENVS: Registry[Env] = Registry(
    "env",
    entry_point_group="agentrl.envs",
    builtin_modules=("envs",),
    error_cls=UnknownEnvError,
    hint=f"See `agentrl envs list`. For an env registered in your own code, {MODULES_HINT}.",
)


def register_env(id: str, entry_point: Any, *, description: str = "", **defaults: Any) -> None:
    """Register an env id with a class/factory or a lazy ``"module:attr"`` string."""
    ENVS.register(id, entry_point, description=description, **defaults)


def make_env(id: str, **kwargs: Any) -> Env:
    """Build a registered env; ``kwargs`` override the registered defaults."""
    return ENVS.make(id, **kwargs)


class GymTextEnv(Env):
    """Run a plain ``gymnasium.Env`` whose observations and actions are text.

    Each text observation becomes a user message (the first one prefixed with
    ``instructions``); the assistant's text, passed through ``parse_action``, is the action.
    An action the inner env's ``action_space`` rejects is not sent to it: the model gets
    ``"Invalid action ..."`` back with reward ``invalid_action_reward`` and may try again.

        env = GymTextEnv("MyTextGame-v0", instructions="Reply with one word.")
        env = GymTextEnv(MyTextGame(), parse_action=str.lower)

    Args:
        env: a ``gymnasium.Env`` or a Gymnasium id for ``gymnasium.make``.
        instructions: text put before the first observation.
        parse_action: assistant text -> inner action (default: the stripped text).
        format_observation: inner observation -> text (default: ``str``).
        invalid_action_reward: reward for an action outside the inner action space.
        make_kwargs: passed to ``gymnasium.make`` when ``env`` is an id.
    """

    def __init__(
        self,
        env: gym.Env[Any, Any] | str,
        *,
        instructions: str = "",
        parse_action: Callable[[str], Any] | None = None,
        format_observation: Callable[[Any], str] = str,
        invalid_action_reward: float = 0.0,
        **make_kwargs: Any,
    ) -> None:
        if isinstance(env, str):
            env = gym.make(env, **make_kwargs)
        elif make_kwargs:
            raise ConfigError(
                f"GymTextEnv got make kwargs {sorted(make_kwargs)} with an env object; "
                "pass them only with a Gymnasium id"
            )
        self.env = env
        self.instructions = instructions
        self.parse_action = parse_action or str.strip
        self.format_observation = format_observation
        self.invalid_action_reward = invalid_action_reward
        spec = getattr(env, "spec", None)
        self._nondeterministic = bool(spec is not None and spec.nondeterministic)

    @property  # type: ignore[misc]
    def nondeterministic(self) -> bool:  # type: ignore[override]
        return self._nondeterministic

    def reset(  # type: ignore[override]
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed, options=options)
        text = self.format_observation(obs)
        if self.instructions:
            text = f"{self.instructions}\n{text}"
        return [Message(role="user", content=text)], dict(info)

    def step(self, action: Message) -> StepResult:  # type: ignore[override]
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
