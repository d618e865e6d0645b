"""The Env contract: Gymnasium-shaped, async-first, speaking chat messages.

    obs, info = await env.areset(seed=s)                                # obs: list[Message]
    obs, reward, terminated, truncated, info = await env.astep(action)  # action: Message

One way to write an env: subclass ``Env`` and implement ``areset`` and ``astep`` (and
``aclose`` when it holds resources). The kernel (AgentLoops, the collector, SFT, the splits)
calls only these. ``reset``/``step``/``close`` on an ``Env`` are sync wrappers that run the
async methods to completion, for Gymnasium's ``check_env``, scripts and tests; nothing
overrides them. Two adapters cover envs written otherwise:

    SyncEnv      implement plain ``reset``/``step``/``close`` (pure-Python envs); the async
                 methods call them inline on the event loop (``SyncEnv`` says why)
    GymTextEnv   (``agentrl/gym_text.py``) an unmodified ``gymnasium.Env`` (an instance, a
                 class or a Gymnasium id) whose observations and actions are text; a SyncEnv

Envs are ``gymnasium.Env`` subclasses with ``MessagesSpace`` observation/action spaces, so
``gymnasium.utils.env_checker.check_env`` runs on them through the sync wrappers (see
``agentrl/env_checker.py``). Tool envs set ``tools`` (a ``ToolSet``); when an action carries
tool calls, ``astep`` runs them with ``await self.acall_tools(action)`` and returns the tool
messages as the observation; a final text answer ends the episode with the reward.

``register_env("ns/Name-vN", "pkg.mod:Cls", **defaults)``; ``make_env`` attaches the env's
Gymnasium ``EnvSpec`` as ``env.spec`` (ids, versions, specs: ``agentrl/env_spec.py``) and applies
``MaxTurns`` for ``max_episode_steps``, which is why ``EnvWrapper`` and ``MaxTurns`` live here
(``TimeLimit`` is in ``agentrl/wrappers.py``).

Deprecated, removed in agentrl 0.3: a class that subclasses ``Env`` directly and overrides
``reset``/``step`` (the old way to write a sync env) is adopted as a ``SyncEnv`` when it is
defined, with a ``DeprecationWarning`` saying what to change (``_adopt_legacy_sync_env``).
"""

from __future__ import annotations

import asyncio
import warnings
from abc import ABCMeta, abstractmethod
from collections.abc import Coroutine
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec  # what make_env attaches as env.spec

from agentrl.env_spec import EnvRegistry
from agentrl.errors import ConfigError
from agentrl.registry import MODULES_HINT, load_entry_point
from agentrl.spaces import MessagesSpace
from agentrl.tool import ToolSet
from agentrl.types import Message

Observation = list[Message]
Info = dict[str, Any]
StepResult = tuple[Observation, float, bool, bool, Info]
R = TypeVar("R")


class Env(gym.Env[Observation, Message], metaclass=ABCMeta):
    """Base class for agentrl environments: implement ``areset`` and ``astep``.

    Example::

        class Echo(Env):
            async def areset(self, *, seed=None, options=None):
                await super().areset(seed=seed)  # seeds self.np_random
                return [user("say hi")], {}

            async def astep(self, action):
                return [], float("hi" in action.text), True, False, {}

        env = Echo()
        obs, info = env.reset(seed=0)  # from sync code: runs areset in an event loop

    An env whose methods are plain functions subclasses ``SyncEnv`` instead; a Gymnasium env
    with text observations runs through ``GymTextEnv``.

    What an env declares or carries:

    - ``nondeterministic``: the same seed may not give the same episode (browsers,
      sandboxes); the checker skips its determinism checks.
    - ``tools``: a ``ToolSet`` of tools the model may call in this env (shown to the model
      through the chat template), or None.
    - ``spec``: the Gymnasium ``EnvSpec`` that ``make_env`` attached (None when built
      directly).

    ``observation_space`` / ``action_space`` default to ``MessagesSpace`` (the action space
    samples calls to ``tools``); assign your own in ``__init__`` to narrow them.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012
    nondeterministic: bool = False
    tools: ToolSet | None = None
    _observation_space: gym.spaces.Space[Any] | None = None
    _action_space: gym.spaces.Space[Any] | None = None

    def __init_subclass__(cls, *, _adapter: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not _adapter:  # the adapters below implement the sync methods on purpose
            _adopt_legacy_sync_env(cls)

    @property
    def observation_space(self) -> gym.spaces.Space[Any]:
        if self._observation_space is None:
            self._observation_space = MessagesSpace.observations()
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space: gym.spaces.Space[Any]) -> None:
        self._observation_space = space

    @property
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

    @property
    def unwrapped(self) -> Env:
        """The innermost env (itself, unless this is a wrapper)."""
        return self

    # --- what a subclass implements (and what the kernel calls) ---------------------------
    @abstractmethod
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        """Start an episode: the first observation (the task prompt) and an info dict.

        Call ``await super().areset(seed=seed)`` first: it seeds ``self.np_random``, from
        which all of the episode's randomness should come (returns an empty observation).
        """
        gym.Env.reset(self, seed=seed)
        return [], {}

    @abstractmethod
    async def astep(self, action: Message) -> StepResult:
        """Apply the assistant's message: (observation, reward, terminated, truncated, info)."""

    async def aclose(self) -> None:
        """Release what the env holds (sandboxes, sessions); the default holds nothing."""

    # --- sync wrappers (Gymnasium's API; not overridden) ----------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        """``areset`` run to completion, for sync callers (not from inside an event loop)."""
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Message) -> StepResult:
        """``astep`` run to completion, for sync callers (not from inside an event loop)."""
        return run_sync(self.astep(action))

    def close(self) -> None:
        """``aclose`` run to completion, for sync callers (not from inside an event loop)."""
        run_sync(self.aclose())

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

    async def ademonstration(self) -> list[Message] | None:
        """``demonstration``, for oracles that must act to know what the env shows (e.g. run
        commands in a sandbox to record their output); SFT calls this one. Override either."""
        return self.demonstration()


def run_sync(coro: Coroutine[Any, Any, R]) -> R:
    """Run an env coroutine from sync code (the sync ``reset``/``step``/``close``); from inside
    a running event loop it raises, naming the async method to await instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()  # never started: no "coroutine was never awaited" warning on top of the error
    raise RuntimeError(
        "called a sync Env method (reset/step/close/demonstration) from inside a running event "
        "loop; await areset()/astep()/aclose()/ademonstration() instead (inside areset(), seed with "
        "`await super().areset(seed=seed)`)"
    )


class SyncEnv(Env, _adapter=True):
    """Adapter for an env written with plain methods: implement ``reset`` and ``step``.

    Example::

        class Echo(SyncEnv):
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)  # seeds self.np_random (the Gymnasium idiom)
                return [user("say hi")], {}

            def step(self, action):
                return [], float("hi" in action.text), True, False, {}

    ``close`` releases resources (default: none). The kernel still calls ``areset``/``astep``/
    ``aclose``; here they call ``reset``/``step``/``close`` **inline**, on the event loop,
    not in a worker thread, because:

    - a pure-Python step is cheaper than a thread hop (a GuessNumber step takes about 10 us
      inline, a round trip through ``asyncio.to_thread`` about 300 us on a busy 2-core
      machine), and thousands of concurrent rollouts would need as many pool threads;
    - the env stays single-threaded: its state and ``self.np_random`` are never touched from
      two threads, and episodes stay reproducible.

    The price: while ``step`` runs, every other rollout on the loop waits, and ``TimeLimit``
    cannot interrupt it. An env that blocks (network, subprocesses, long computations) should
    be an async ``Env``, whose ``astep`` can ``await asyncio.to_thread(...)`` the blocking
    part.
    """

    @abstractmethod
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        """Start an episode; call ``super().reset(seed=seed)`` first to seed ``self.np_random``."""
        gym.Env.reset(self, seed=seed)
        return [], {}

    @abstractmethod
    def step(self, action: Message) -> StepResult:
        """Apply the assistant's message: (observation, reward, terminated, truncated, info)."""

    def close(self) -> None:
        """Release what the env holds; the default holds nothing."""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        return self.reset(seed=seed, options=options)

    async def astep(self, action: Message) -> StepResult:
        return self.step(action)

    async def aclose(self) -> None:
        self.close()


class _SyncCloseEnv(Env, _adapter=True):
    """Deprecated path: an async env that overrides the sync ``close``; ``aclose`` runs it."""

    def close(self) -> None:
        """The old base's ``close``: nothing to release."""

    async def aclose(self) -> None:
        self.close()


LEGACY_REMOVED_IN = "0.3"


def _adopt_legacy_sync_env(cls: type[Env]) -> None:
    """Deprecated, removed in agentrl 0.3 with the old way it supports.

    The old ``Env`` ran whichever of ``reset``/``areset`` a subclass wrote. A class that still
    subclasses ``Env`` directly and overrides ``reset``/``step`` gets ``SyncEnv`` as its base
    in place of ``Env`` (``super().reset(seed=seed)`` keeps seeding), and one overriding only
    ``close`` gets a base whose ``aclose`` calls it. This runs once, when the class is
    defined; it is the only place that looks at which methods a class defines.
    """
    overridden = [m for m in ("reset", "step", "close") if m in vars(cls)]
    if not overridden or SyncEnv in cls.__mro__:
        return
    names = "/".join(f"{m}()" for m in overridden)
    if Env not in cls.__bases__:
        warnings.warn(
            f"{cls.__qualname__} overrides {names}, the sync wrappers of an async Env; rollouts "
            "call areset()/astep()/aclose() and never use them. Implement the async methods, or "
            "derive the env from agentrl.env.SyncEnv.",
            DeprecationWarning,
            stacklevel=4,  # _adopt <- __init_subclass__ <- ABCMeta.__new__ <- the class statement
        )
        return
    sync = "reset" in overridden or "step" in overridden
    base = SyncEnv if sync else _SyncCloseEnv
    cls.__bases__ = tuple(base if b is Env else b for b in cls.__bases__)
    fix, now = (
        (
            "subclass agentrl.env.SyncEnv instead of Env (same methods; super().reset(seed=seed) "
            "still seeds), or write async areset()/astep()",
            "it is adopted as a SyncEnv",
        )
        if sync
        else ("write `async def aclose(self)` instead of close()", "aclose() calls it")
    )
    warnings.warn(
        f"{cls.__qualname__} overrides {names} of agentrl.env.Env, which now runs only "
        f"areset()/astep()/aclose(): {fix}. Until agentrl {LEGACY_REMOVED_IN} it still works "
        f"({now}).",
        DeprecationWarning,
        stacklevel=4,
    )


# --- wrappers that make_env applies (the rest are in agentrl/wrappers.py) -------------------
class EnvWrapper(Env):
    """Base class for wrappers: override ``on_reset`` / ``on_step``.

    Forwards everything it does not change (``tools``, ``nondeterministic``,
    ``demonstration()``, the spaces, ``spec``, ``np_random``, other attributes) to the wrapped
    env, and calls its async methods; ``reset``/``step`` from sync code run them like any
    ``Env``'s. See ``agentrl/wrappers.py``.
    """

    def __init__(self, env: Env) -> None:
        if not isinstance(env, Env):
            raise ConfigError(
                f"{type(self).__name__} wraps an agentrl Env, got {type(env).__name__}; a "
                "plain gymnasium.Env goes through agentrl.gym_text.GymTextEnv first"
            )
        self.env = env

    # --- forwarded attributes (assigning one sets the wrapped env's) -------------------------
    @property
    def tools(self) -> ToolSet | None:
        return self.env.tools

    @tools.setter
    def tools(self, value: ToolSet | None) -> None:
        self.env.tools = value

    @property
    def nondeterministic(self) -> bool:
        return self.env.nondeterministic

    @nondeterministic.setter
    def nondeterministic(self, value: bool) -> None:
        self.env.nondeterministic = value

    @property
    def observation_space(self) -> gym.spaces.Space[Any]:
        return self.env.observation_space

    @observation_space.setter
    def observation_space(self, space: gym.spaces.Space[Any]) -> None:
        self.env.observation_space = space

    @property
    def action_space(self) -> gym.spaces.Space[Any]:
        return self.env.action_space

    @action_space.setter
    def action_space(self, space: gym.spaces.Space[Any]) -> None:
        self.env.action_space = space

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    @property
    def spec(self) -> EnvSpec | None:
        return self.env.spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self.env.spec = value

    @property
    def np_random(self) -> np.random.Generator:
        return self.env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def demonstration(self) -> list[Message] | None:
        return self.env.demonstration()

    async def ademonstration(self) -> list[Message] | None:
        return await self.env.ademonstration()

    def task_key(self, observation: Observation, info: Info) -> str:
        return self.env.task_key(observation, info)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{self.env!r}>"

    # --- hooks ----------------------------------------------------------------------------
    def on_reset(self) -> None:
        """Called after every reset of the inner env."""

    def on_step(self, result: StepResult) -> StepResult:
        """Called with every step result of the inner env; returns the (changed) result."""
        return result

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        out = await self.env.areset(seed=seed, options=options)
        self.on_reset()
        return out

    async def astep(self, action: Message) -> StepResult:
        return self.on_step(await self.env.astep(action))

    async def aclose(self) -> None:
        await self.env.aclose()


def truncate(result: StepResult, by: str) -> StepResult:
    """``result`` truncated (``info["truncated_by"] = by``) unless it already ended."""
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
        return truncate(result, "max_turns") if self.turns >= self.max_turns else result


# --- the registry ---------------------------------------------------------------------------
ENVS: EnvRegistry[Env] = EnvRegistry(
    entry_point_group="agentrl.envs",
    hint=f"See `agentrl envs list`. For an env registered in your own code, {MODULES_HINT}.",
)


def register_env(
    id: str,
    entry_point: Any,
    *,
    description: str = "",
    max_episode_steps: int | None = None,
    **defaults: Any,
) -> None:
    """Register ``ns/Name-vN`` with a class/factory or a lazy ``"module:attr"`` string.

    ``defaults`` are constructor kwargs (``make_env`` overrides them); ``max_episode_steps``
    makes ``make_env`` wrap the env in ``MaxTurns``. A malformed id raises ``ConfigError``.
    """
    ENVS.register(
        id,
        entry_point,
        description=description,
        max_episode_steps=max_episode_steps,
        **defaults,
    )


ENV_PREFIXES: dict[str, str] = {"remote:": "agentrl.envserver.client:make_remote_env"}
"""Env ids that name an env served elsewhere: prefix -> lazy ``module:attr`` factory, called
with the rest of the id and the kwargs (``remote:URL/ns/Name-vN``: agentrl/envserver)."""


def make_env(id: str, **kwargs: Any) -> Env:
    """Build a registered env; ``kwargs`` override the registered defaults.

    The env carries its spec, a Gymnasium ``EnvSpec``, as ``env.spec``: ``id`` (with
    ``namespace``, ``name``, ``version``), ``entry_point``, ``max_episode_steps`` and the
    ``kwargs`` it was built with. ``"remote:URL/ns/Name-vN"`` builds a ``RemoteEnv`` whose
    episodes run on an env server (``agentrl.envserver.client``). An unknown id raises ``UnknownEnvError`` naming the versions
    of its name that exist (``arith/Calculator-v1 does not exist; available versions: v0``).
    """
    for prefix, factory in ENV_PREFIXES.items():
        if isinstance(id, str) and id.startswith(prefix):
            env = load_entry_point(factory)(id.removeprefix(prefix), **kwargs)
            if not isinstance(env, Env):
                raise ENVS.not_an_env(id, env, adapter="GymTextEnv")
            return env
    env = ENVS.make(id, **kwargs)
    if not isinstance(env, Env):
        raise ENVS.not_an_env(id, env, adapter="GymTextEnv")
    env.spec = ENVS.env_spec(id, kwargs, nondeterministic=env.nondeterministic)
    steps = env.spec.max_episode_steps
    return env if steps is None else MaxTurns(env, steps)


def __getattr__(name: str) -> object:
    """Deprecated: ``GymTextEnv`` is imported from ``agentrl.gym_text`` (it builds on this
    module, so this one does not import it); the old spelling resolves for one release, with a
    DeprecationWarning."""
    if name == "GymTextEnv":
        import importlib
        import warnings

        warnings.warn(
            "import GymTextEnv from agentrl.gym_text, not agentrl.env",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("agentrl.gym_text").GymTextEnv
    raise AttributeError(f"module 'agentrl.env' has no attribute {name!r}")
