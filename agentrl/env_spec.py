"""Env ids and the env registry: ids parsed as ``ns/Name-vN``, misses that name the versions.

    parse_env_id("games/GuessNumber-v0")   # EnvId(namespace='games', name='GuessNumber', version=0)
    make_env("arith/Calculator-v1")        # UnknownEnvError: arith/Calculator-v1 does not exist;
                                           #   available versions: v0. Did you mean 'arith/Calculator-v0'?

``EnvRegistry`` is the ``Registry`` behind ``register_env``/``make_env`` (agentrl/env.py). It
refuses a malformed id when it is registered (``ConfigError`` naming the expected form), keeps
each id's ``max_episode_steps``, and turns a miss into an ``UnknownEnvError`` that says which
versions of the name exist, or what an id must look like. ``EnvRegistry.env_spec`` builds the
Gymnasium ``EnvSpec`` (id, entry point, max steps, kwargs) that ``make_env`` attaches to the
env as ``env.spec``, as ``gymnasium.make`` does. This module holds no env code, so it imports
nothing from ``env.py``.

Ids are stricter than Gymnasium's (which allows ``Name`` and ``Name-vN`` alone): every env id
has a namespace and a version, so a new version of an env never silently replaces the old one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from agentrl.errors import ConfigError, DuplicateIdError, UnknownEnvError, UnknownIdError
from agentrl.registry import Registry, Spec

T = TypeVar("T")

ENV_ID_FORM = "'namespace/Name-vN', e.g. 'games/GuessNumber-v0'"
"""What an env id looks like, as error messages say it."""

_ENV_ID = re.compile(r"^(?P<namespace>[\w.-]+)/(?P<name>[\w.-]+?)-v(?P<version>\d+)$")


class EnvId(NamedTuple):
    """The parts of an env id ``namespace/Name-vN``."""

    namespace: str
    name: str
    version: int

    @property
    def base(self) -> str:
        """``namespace/Name``: the id without its version."""
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.base}-v{self.version}"


def parse_env_id(env_id: str) -> EnvId:
    """Split ``ns/Name-vN`` into its parts; ``ConfigError`` naming the expected form otherwise."""
    m = _ENV_ID.match(env_id) if isinstance(env_id, str) else None
    if m is None:
        raise ConfigError(f"env id {env_id!r} is malformed: env ids look like {ENV_ID_FORM}")
    return EnvId(m["namespace"], m["name"], int(m["version"]))


def _versions(known: Iterable[str], base: str) -> list[int]:
    """The versions registered under ``namespace/Name``, ascending."""
    found = []
    for k in known:
        m = _ENV_ID.match(k)
        if m is not None and f"{m['namespace']}/{m['name']}" == base:
            found.append(int(m["version"]))
    return sorted(found)


def unknown_env_error(env_id: str, known: Iterable[str], hint: str = "") -> UnknownEnvError:
    """The error for an id that is not registered: versions of its name if any exist, the
    expected form if it is malformed, else "did you mean" by spelling."""
    known = sorted(known)
    malformed = ""
    try:
        base, what = parse_env_id(env_id).base, f"{env_id} does not exist"
    except ConfigError as e:  # maybe a known name without its version
        base = env_id.rstrip("-") if isinstance(env_id, str) else ""
        what = f"env id {env_id!r} has no version (env ids look like 'namespace/Name-vN')"
        malformed = f"{e}."
    versions = _versions(known, base)
    if not versions:  # spelling-based "did you mean", after the form if the id is malformed
        return UnknownEnvError("env", env_id, known, hint, reason=malformed)
    listed = ", ".join(f"v{v}" for v in versions)
    newest_first = [f"{base}-v{v}" for v in reversed(versions)]
    return UnknownEnvError(
        "env",
        env_id,
        known,
        hint,
        reason=f"{what}; available versions: {listed}.",
        suggestions=newest_first,
    )


class EnvRegistry(Registry[T]):
    """The env ``Registry``: ``ns/Name-vN`` ids, ``max_episode_steps``, version-aware misses."""

    def __init__(
        self,
        *,
        entry_point_group: str | None = None,
        builtin_modules: tuple[str, ...] = (),
        hint: str = "",
    ) -> None:
        super().__init__(
            "env",
            entry_point_group=entry_point_group,
            builtin_modules=builtin_modules,
            error_cls=UnknownEnvError,
            hint=hint,
        )
        self._max_steps: dict[str, int | None] = {}

    def register(
        self,
        id: str,
        entry_point: str | Callable[..., T],
        *,
        description: str = "",
        override: bool = False,
        max_episode_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Register ``id`` (``ns/Name-vN``); ``max_episode_steps`` truncates its episodes."""
        parse_env_id(id)
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ConfigError(f"{id}: max_episode_steps must be >= 1, got {max_episode_steps}")
        old = self._max_steps.get(id)
        if id in self._max_steps and old != max_episode_steps and not override:
            raise DuplicateIdError(
                f"env {id!r} is registered twice with different max_episode_steps: {old} and "
                f"{max_episode_steps}. Remove one registration, register under another id "
                "(a new version), or pass override=True."
            )
        super().register(id, entry_point, description=description, override=override, **kwargs)
        self._max_steps[id] = max_episode_steps

    def env_spec(
        self, id: str, kwargs: dict[str, Any], *, nondeterministic: bool = False
    ) -> EnvSpec:
        """The spec ``make_env`` attaches to an env built from ``id`` with ``kwargs``."""
        entry = self.spec(id)
        return EnvSpec(
            id=id,
            entry_point=entry.entry_point_str,
            nondeterministic=nondeterministic,
            max_episode_steps=self._max_steps.get(id),
            order_enforce=False,  # agentrl's make applies none of gymnasium.make's wrappers
            disable_env_checker=True,
            kwargs={**entry.kwargs, **kwargs},
        )

    def not_an_env(self, id: str, made: object, *, adapter: str) -> ConfigError:
        """The error for an entry point that built something other than an agentrl env."""
        what = type(made).__name__
        fix = (
            f"register a plain gymnasium.Env through the adapter: register_env({id!r}, "
            f"{adapter}, env={what}, instructions=...)"
            if isinstance(made, gym.Env)
            else "the entry point must return an agentrl.env.Env"
        )
        entry = self.spec(id).entry_point_str
        return ConfigError(f"env {id!r}: {entry} made a {what}, not an agentrl Env; {fix}")

    def max_episode_steps(self, id: str) -> int | None:
        """The step limit ``id`` was registered with (None: the env's own ending only)."""
        return self._max_steps.get(id)

    def spec(self, id: str) -> Spec[T]:
        try:
            return super().spec(id)
        except UnknownIdError:
            raise unknown_env_error(id, self.ids(), self._hint) from None

    def unregister(self, id: str) -> None:
        super().unregister(id)
        self._max_steps.pop(id, None)
