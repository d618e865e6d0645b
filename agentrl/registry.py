"""Registries: one explicit call, a lazy ``module:attr`` import string, a helpful miss.

    register_env("ns/Name-v0", entry_point="pkg.mod:Cls", max_turns=10)
    make_env("ns/Name-v1")  # UnknownEnvError: no env 'ns/Name-v1'. Did you mean 'ns/Name-v0'?

A ``Registry`` maps ids to entry points (a callable, or a ``"module:attr"`` string imported on
first use) plus default keyword arguments. Third-party packages add ids through a Python
entry-point group (``[project.entry-points."agentrl.envs"]``), read once, lazily.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentrl.errors import ConfigError, DuplicateIdError, UnknownIdError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def load_entry_point(spec: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    if ":" not in spec:
        raise ConfigError(f"entry point {spec!r} must look like 'package.module:attribute'")
    mod_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(slots=True)
class Spec(Generic[T]):
    """A registered id: where its object lives and the defaults it is made with."""

    id: str
    entry_point: str | Callable[..., T]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., T]:
        ep = self.entry_point
        if isinstance(ep, str):
            ep = load_entry_point(ep)
            self.entry_point = ep
        return ep  # type: ignore[return-value]

    @property
    def entry_point_str(self) -> str:
        ep = self.entry_point
        return ep if isinstance(ep, str) else f"{ep.__module__}:{ep.__qualname__}"


class Registry(Generic[T]):
    """A named collection of factories, keyed by id."""

    def __init__(
        self,
        kind: str,
        *,
        entry_point_group: str | None = None,
        builtin_modules: tuple[str, ...] = (),
        error_cls: type[UnknownIdError] = UnknownIdError,
        hint: str = "",
    ) -> None:
        self.kind = kind
        self._specs: dict[str, Spec[T]] = {}
        self._group = entry_point_group
        self._builtin_modules = builtin_modules
        self._loaded_plugins = False
        self._error_cls = error_cls
        self._hint = hint

    def register(
        self,
        id: str,
        entry_point: str | Callable[..., T],
        *,
        description: str = "",
        override: bool = False,
        **kwargs: Any,
    ) -> None:
        if not id or not isinstance(id, str):
            raise ConfigError(f"{self.kind} id must be a non-empty string, got {id!r}")
        if id in self._specs and not override:
            old = self._specs[id]
            if (
                old.entry_point_str == Spec(id, entry_point).entry_point_str
                and old.kwargs == kwargs
            ):
                return  # re-registering the same thing (a module imported twice) is harmless
            raise DuplicateIdError(
                f"{self.kind} {id!r} is already registered (entry point {old.entry_point_str}); "
                f"pick another id or pass override=True."
            )
        self._specs[id] = Spec(id, entry_point, dict(kwargs), description)

    def decorator(self, id: str, **kwargs: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def wrap(obj: Callable[..., T]) -> Callable[..., T]:
            self.register(id, obj, **kwargs)
            return obj

        return wrap

    def _load_plugins(self) -> None:
        if self._loaded_plugins:
            return
        self._loaded_plugins = True
        for mod in self._builtin_modules:
            importlib.import_module(mod)
        if self._group is None:
            return
        for ep in importlib.metadata.entry_points(group=self._group):
            if ep.name not in self._specs:
                self._specs[ep.name] = Spec(ep.name, ep.value)

    def spec(self, id: str) -> Spec[T]:
        self._load_plugins()
        try:
            return self._specs[id]
        except KeyError:
            raise self._error_cls(self.kind, id, self._specs, self._hint) from None

    def get(self, id: str) -> Callable[..., T]:
        return self.spec(id).load()

    def make(self, id: str, **kwargs: Any) -> T:
        spec = self.spec(id)
        return spec.load()(**{**spec.kwargs, **kwargs})

    def ids(self) -> list[str]:
        self._load_plugins()
        return sorted(self._specs)

    def __contains__(self, id: object) -> bool:
        self._load_plugins()
        return id in self._specs

    def __iter__(self) -> Iterator[Spec[T]]:
        self._load_plugins()
        return iter([self._specs[k] for k in sorted(self._specs)])

    def unregister(self, id: str) -> None:
        self._specs.pop(id, None)
