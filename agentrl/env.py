"""The Env contract: Gymnasium-shaped, async-first, speaking chat messages.

    obs, info = await env.areset(seed=s)                          # obs: list[Message]
    obs, reward, terminated, truncated, info = await env.astep(action)  # action: Message

An env owns the task, the world state and the reward. ``reset``/``step`` (sync) and
``areset``/``astep`` (async) are twins: implement whichever fits and the other works.
Envs are ``gymnasium.Env`` subclasses, so ``gymnasium.utils.env_checker.check_env`` runs on
them too (see ``agentrl/env_checker.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.registry import Registry
from agentrl.errors import UnknownEnvError
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
                super().reset(seed=seed)
                return [user("say hi")], {}

            async def astep(self, action):
                return [], float("hi" in action.text), True, False, {}

    Class attributes:
      ``nondeterministic``: the same seed may not give the same episode (browsers, sandboxes);
      the checker skips its determinism checks.
      ``tools``: a ``ToolSet`` of tools the model may call in this env (shown to the model
      through the chat template), or None.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    nondeterministic: ClassVar[bool] = False
    tools: Any = None  # agentrl.tool.ToolSet | None

    # --- async API (what AgentLoops call) ---------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        if type(self).reset is Env.reset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        return self.reset(seed=seed, options=options)

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
        if type(self).areset is Env.areset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        return _run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Message) -> StepResult:  # type: ignore[override]
        if type(self).astep is Env.astep:
            raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")
        return _run_sync(self.astep(action))

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
        "called a sync Env method from inside a running event loop; use areset()/astep() instead"
    )


ENVS: Registry[Env] = Registry(
    "env",
    entry_point_group="agentrl.envs",
    builtin_modules=("envs",),
    error_cls=UnknownEnvError,
    hint="See `agentrl envs list`.",
)


def register_env(id: str, entry_point: Any, *, description: str = "", **defaults: Any) -> None:
    """Register an env id with a class/factory or a lazy ``"module:attr"`` string."""
    ENVS.register(id, entry_point, description=description, **defaults)


def make_env(id: str, **kwargs: Any) -> Env:
    """Build a registered env; ``kwargs`` override the registered defaults."""
    return ENVS.make(id, **kwargs)
