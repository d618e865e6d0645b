"""Typed configuration: dataclasses with defaults written once, YAML recipes, dotted overrides.

    cfg = load_config(RunConfig, "recipes/quickstart.yaml", ["rollout.group_size=8"])

Components carry their own ``Config`` dataclass; a recipe is a YAML file (or a Python
function) whose keys mirror those dataclasses. omegaconf does the merging and type checking;
this module turns its errors into ``ConfigError``s that name the bad key, what was expected
and the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from agentrl.errors import ConfigError

C = TypeVar("C")


def _valid_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        full = f"{prefix}{f.name}"
        keys.append(full)
        t = hints.get(f.name, f.type)
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            keys.extend(_valid_keys(t, full + "."))
    return keys


def _explain(cls: type, err: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigAttributeError | ConfigKeyError):
        close = difflib.get_close_matches(key, _valid_keys(cls), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return ConfigError(f"unknown config key {key!r} in {source}.{hint}")
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"bad value for config key {key!r} in {source}: {msg}")
    return ConfigError(f"invalid config in {source}: {err}")


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> C:
    """Build ``cls`` from its defaults, then ``base``, then a YAML file, then ``key=value`` overrides."""
    schema = OmegaConf.structured(cls)
    layers: list[tuple[str, Any]] = []
    if base:
        layers.append(("base", OmegaConf.create(base)))
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe file {str(p)!r} does not exist")
        layers.append((str(p), OmegaConf.load(p)))
    for o in overrides or []:
        if "=" not in o:
            raise ConfigError(f"override {o!r} must look like key=value, e.g. rollout.group_size=8")
        layers.append(
            (o, None) if _indexed(o) else (f"override {o!r}", OmegaConf.from_dotlist([o]))
        )
    merged = schema
    for source, layer in layers:
        if layer is None:  # a list entry by index: data.envs.0.kwargs.max_steps=4
            _update_indexed(merged, source)
            continue
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise _explain(cls, e, source) from None
    try:
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _explain(cls, e, "the merged config") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj  # type: ignore[return-value]


def _indexed(override: str) -> bool:
    return any(part.isdigit() for part in override.partition("=")[0].split("."))


def _update_indexed(merged: Any, override: str) -> None:
    """Apply ``a.b.0.c=value`` in place: the part after a list's key indexes that list."""
    key, _, rhs = override.partition("=")
    value = OmegaConf.from_dotlist([f"value={rhs}"]).value
    try:
        OmegaConf.update(merged, key, value, merge=True)
    except (OmegaConfBaseException, IndexError, TypeError) as e:
        parts = key.split(".")
        i = next(k for k, part in enumerate(parts) if part.isdigit())
        node = OmegaConf.select(merged, ".".join(parts[:i]))
        size = f"it has {len(node)} entries" if isinstance(node, ListConfig) else "not a list"
        raise ConfigError(
            f"override {override!r}: {'.'.join(parts[:i])}[{parts[i]}] cannot be set ({size}; "
            f"{type(e).__name__}: {str(e).splitlines()[0]}). Index an existing entry, or give "
            f"the whole list, e.g. {'.'.join(parts[:i])}=[{{...}}]"
        ) from None


def to_yaml(cfg: Any) -> str:
    """Render a config dataclass as YAML (saved next to every run for reproducibility)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
