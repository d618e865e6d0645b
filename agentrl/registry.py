"""Registries: one explicit call, a lazy ``module:attr`` import string, a helpful miss.

    register_env("ns/Name-v0", entry_point="pkg.mod:Cls", max_turns=10)
    make_env("ns/Name-v1")  # UnknownEnvError: no env 'ns/Name-v1'. Did you mean 'ns/Name-v0'?

A ``Registry`` maps ids to entry points (a callable, or a ``"module:attr"`` string imported on
first use) plus default keyword arguments. Third-party packages add ids through a Python
entry-point group (``[project.entry-points."agentrl.envs"]``), read once, lazily.

An id registered both in code and through an entry point is fine when both name the same
object (the code registration, with its defaults, is kept); two different objects under one
id raise ``DuplicateIdError`` when the second one arrives, naming both.

User code that registers things is imported with ``import_modules`` (the CLI's ``--module``
flag and the recipe key ``modules``); a module in the current directory needs no PYTHONPATH.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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


MODULES_HINT = (
    "pass --module YOUR_MODULE (recipe key `modules`) to import the code that registers it"
)


def import_modules(modules: Iterable[str], *, key: str = "--module") -> None:
    """Import user modules for what they register (envs, AgentLoops, tools, ...).

    Each entry is a module name (``my_envs``, ``my_pkg.loops``), found in the current
    directory first and then on ``sys.path``, or a path to a ``.py`` file (imported under its
    file name). A module that cannot be found raises ``ConfigError`` naming ``key``.
    """
    for spec in modules:
        if spec.endswith(".py") or "/" in spec or os.sep in spec:
            path = Path(spec)
            if not path.is_file():
                raise ConfigError(f"{key} {spec!r}: no such file (from {os.getcwd()})")
            directory, name = str(path.resolve().parent), path.stem
        else:
            directory, name = os.getcwd(), spec
        if directory not in sys.path:
            sys.path.insert(0, directory)  # like `python -m`: the current directory first
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError(
                    f"{key} {spec!r}: importing it failed because module {e.name!r} is missing; "
                    f"install it ({e})"
                ) from e
            raise ConfigError(
                f"{key} {spec!r}: no module {e.name!r} in the current directory ({os.getcwd()}) "
                "or on sys.path; give a module name (my_envs, my_pkg.loops) or a file path "
                "(./my_envs.py)"
            ) from None


@dataclass(slots=True)
class Spec(Generic[T]):
    """A registered id: where its object lives and the defaults it is made with."""

    id: str
    entry_point: str | Callable[..., T]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    origin: str = "code"
    """Where the registration came from: "code", or the entry point that declared it."""

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
        self._plugin_error: DuplicateIdError | None = None
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
        new = Spec(id, entry_point, dict(kwargs), description)
        if id in self._specs and not override:
            old = self._specs[id]
            if old.origin != "code" and _same_target(old, new) is not False:
                # The code that an entry point names registers itself: one registration.
                self._specs[id] = new
                return
            if _same_target(old, new) and old.kwargs == kwargs:
                return  # re-registering the same thing (a module imported twice) is harmless
            raise self._duplicate(old, new)
        self._specs[id] = new

    def _duplicate(self, old: Spec[T], new: Spec[T]) -> DuplicateIdError:
        what = (
            f"defaults {old.kwargs} and {new.kwargs}"
            if _same_target(old, new)
            else f"{old.entry_point_str} ({old.origin}) and {new.entry_point_str} ({new.origin})"
        )
        return DuplicateIdError(
            f"{self.kind} {old.id!r} is registered twice with different targets: {what}. "
            "Remove one registration, register under another id, or pass override=True."
        )

    def decorator(self, id: str, **kwargs: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def wrap(obj: Callable[..., T]) -> Callable[..., T]:
            self.register(id, obj, **kwargs)
            return obj

        return wrap

    def _load_plugins(self) -> None:
        if self._plugin_error is not None:
            raise self._plugin_error
        if self._loaded_plugins:
            return
        self._loaded_plugins = True
        from agentrl.plugins import load_plugins

        load_plugins()
        for mod in self._builtin_modules:
            importlib.import_module(mod)
        if self._group is None:
            return
        for ep in importlib.metadata.entry_points(group=self._group):
            dist = getattr(ep.dist, "name", None) or "an installed package"
            new: Spec[T] = Spec(ep.name, ep.value, origin=f"entry point of {dist}")
            old = self._specs.get(ep.name)
            if old is None:
                self._specs[ep.name] = new
            elif _same_target(old, new) is False:
                self._plugin_error = self._duplicate(old, new)
                raise self._plugin_error

    def spec(self, id: str) -> Spec[T]:
        self._load_plugins()
        try:
            return self._specs[id]
        except KeyError:
            raise self._error_cls(self.kind, id, self._specs, self._hint) from None

    def get(self, id: str) -> Callable[..., T]:
        obj = self.spec(id).load()
        # Loading an entry point imports its module, which may register the id in code (with
        # defaults); that registration replaced the entry point's and is the one to use.
        return self._specs[id].load() if id in self._specs else obj

    def make(self, id: str, **kwargs: Any) -> T:
        factory = self.get(id)
        return factory(**{**self._specs[id].kwargs, **kwargs})

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


def _same_target(a: Spec[Any], b: Spec[Any]) -> bool | None:
    """Whether two specs name the same object (imports a lazy string's module to tell).

    None when it cannot be told yet: a module that is still being imported (the entry point's
    own module registering itself under a re-exported name) lacks the attribute so far.
    """
    if a.entry_point_str == b.entry_point_str:
        return True
    objs = [_resolved(s) for s in (a, b)]
    if any(o is None for o in objs):
        return None
    return objs[0] is objs[1]


def _resolved(spec: Spec[Any]) -> object | None:
    ep = spec.entry_point
    if not isinstance(ep, str):
        return ep
    mod_name, _, attr = ep.partition(":")
    obj: Any = sys.modules.get(mod_name)
    if obj is None:
        try:
            obj = importlib.import_module(mod_name)
        except ImportError:
            return object()  # cannot be imported: differs from every other target
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    return obj
