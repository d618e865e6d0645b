"""JSON schema for tools: built from a function's type hints and docstring, and checked.

    function_schema(fn) -> FunctionSchema(description, parameters, injected)
    validate_arguments(tool_name, parameters, arguments) -> kwargs  (or ToolArgumentError)

Supported hints: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Optional[X]`` / ``X | None``,
``Union``, ``Literal[...]``, ``Enum`` subclasses, ``list[X]`` / ``tuple[X, ...]`` /
``Sequence[X]``, ``dict[str, X]`` and ``Any``. Parameters with defaults are not required.
Descriptions come from a Google-style docstring (text before ``Args:``, then one
``name: text`` or ``name (type): text`` entry per parameter, continuation lines indented).

The validator covers exactly the schema subset built here, so its messages can be written
for the model: what was expected, what arrived, and the parameter list. It is lenient
where models commonly slip: numeric strings for numbers, ``"true"``/``"false"`` for booleans
and whole floats for integers are accepted and converted.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from agentrl.errors import ToolError
from agentrl.types import JSON

T = TypeVar("T")


class _InjectedMarker:
    def __repr__(self) -> str:
        return "Injected"


INJECTED = _InjectedMarker()
Injected = Annotated[T, INJECTED]
"""``sandbox: Injected[Sandbox]`` hides a parameter from the schema; the caller supplies it."""


class ToolArgumentError(ToolError, ValueError):
    """The model's arguments do not fit the tool's schema. The message is for the model."""


@dataclass(frozen=True, slots=True)
class FunctionSchema:
    description: str
    parameters: JSON  # {"type": "object", "properties": ..., "required": [...]}
    injected: tuple[str, ...]


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?)\s*:\s*$"
)
_ARG = re.compile(r"^\s*\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description})."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = 0
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section, current = m.group(1).lower(), None
            continue
        if section is None:
            desc.append(line)
        elif section in ("args", "arguments", "parameters") and line.strip():
            indent = len(line) - len(line.lstrip())
            am = _ARG.match(line)
            if am and (current is None or indent <= arg_indent):
                current, arg_indent = am.group(1), indent
                args[current] = am.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(desc).strip(), args


def type_schema(hint: Any) -> JSON:
    """The JSON schema of one type hint."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([m.value for m in hint])
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return type_schema(args[0])
    if origin is Literal:
        return _enum_schema(list(args))
    if origin in (Union, types.UnionType):
        return _union_schema(args)
    if origin in (list, set, frozenset, tuple) or origin is typing.Sequence or _is_abc_seq(origin):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {
                "type": "array",
                "prefixItems": [type_schema(a) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin is dict or hint is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1]) if args else {}}
    if hint is list:
        return {"type": "array", "items": {}}
    raise ToolError(
        f"cannot build a JSON schema for type {hint!r}; use str, int, float, bool, "
        "Literal, Optional, list[...] or dict[str, ...]"
    )


def _is_abc_seq(origin: Any) -> bool:
    import collections.abc as cabc

    return origin in (cabc.Sequence, cabc.Iterable, cabc.Collection, cabc.Set, cabc.MutableSequence)


def _enum_schema(values: list[Any]) -> JSON:
    kinds = {type(v) for v in values}
    out: JSON = {"enum": values}
    if len(kinds) == 1:
        t = type_schema(kinds.pop()).get("type")
        if t:
            out = {"type": t, "enum": values}
    return out


def _union_schema(args: tuple[Any, ...]) -> JSON:
    subs = [type_schema(a) for a in args]
    plain = [s.get("type") for s in subs]
    if all(isinstance(t, str) and len(s) == 1 for t, s in zip(plain, subs, strict=True)):
        return {"type": plain}  # e.g. ["integer", "null"]
    return {"anyOf": subs}


def function_schema(fn: Callable[..., Any], *, inject: tuple[str, ...] = ()) -> FunctionSchema:
    """Build the description and parameters schema of ``fn``; ``inject`` names hidden params."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:
        raise ToolError(f"cannot resolve the type hints of {fn.__qualname__}: {e}") from e
    description, arg_docs = parse_docstring(fn.__doc__)
    sig = inspect.signature(fn)
    unknown = [k for k in inject if k not in sig.parameters]
    if unknown:
        raise ToolError(f"{fn.__qualname__}: inject={unknown} names no parameter of the function")
    props: JSON = {}
    required: list[str] = []
    injected = list(inject)
    for pname, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolError(f"{fn.__qualname__}: *args/**kwargs cannot be tool parameters")
        hint = hints.get(pname, Any)
        is_marked = get_origin(hint) is Annotated and INJECTED in get_args(hint)[1:]
        if is_marked and pname not in injected:
            injected.append(pname)
        if pname in injected:
            continue
        s = type_schema(hint)
        if pname in arg_docs:
            s["description"] = arg_docs[pname]
        if p.default is p.empty:
            required.append(pname)
        elif p.default is None or isinstance(p.default, str | int | float | bool):
            s["default"] = p.default.value if isinstance(p.default, enum.Enum) else p.default
        props[pname] = s
    params: JSON = {"type": "object", "properties": props, "required": required}
    return FunctionSchema(
        description=description or fn.__qualname__, parameters=params, injected=tuple(injected)
    )


# --- validation ----------------------------------------------------------------------------
def validate_arguments(tool_name: str, parameters: JSON, arguments: Any) -> JSON:
    """Check ``arguments`` against ``parameters`` and return the (converted) kwargs."""
    props: JSON = parameters.get("properties", {})
    expected = ", ".join(f"{k}: {_describe(v)}" for k, v in props.items()) or "no arguments"
    where = f"bad arguments for tool {tool_name!r} (expected {expected})"
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"{where}: arguments must be a JSON object, got {_show(arguments)}")
    extra = [k for k in arguments if k not in props]
    if extra:
        raise ToolArgumentError(f"{where}: unknown argument(s) {', '.join(map(repr, extra))}")
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        raise ToolArgumentError(
            f"{where}: missing required argument(s) {', '.join(map(repr, missing))}"
        )
    out: JSON = {}
    for k, v in arguments.items():
        try:
            out[k] = _check(props[k], v)
        except ToolArgumentError as e:
            raise ToolArgumentError(f"{where}: argument {k!r} {e}") from None
    return out


def _describe(s: JSON) -> str:
    if "enum" in s:
        return " | ".join(repr(v) for v in s["enum"])
    t = s.get("type")
    if isinstance(t, list):
        return " | ".join(t)
    if t == "array":
        return f"array of {_describe(s.get('items', {}))}"
    if "anyOf" in s:
        return " | ".join(_describe(x) for x in s["anyOf"])
    return t or "any"


def _show(v: Any) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r if len(r) < 60 else r[:57] + '...'}"


def _check(s: JSON, v: Any) -> Any:
    if "enum" in s:
        if v not in s["enum"]:
            raise ToolArgumentError(f"must be one of {s['enum']}, got {_show(v)}")
        return v
    if "anyOf" in s:
        specific: ToolArgumentError | None = None
        for sub in s["anyOf"]:
            try:
                return _check(sub, v)
            except ToolArgumentError as e:
                if (sub.get("type"), type(v)) in (("array", list), ("object", dict)):
                    specific = e  # the right container with a wrong item: report the item
        raise specific or ToolArgumentError(f"must be {_describe(s)}, got {_show(v)}")
    t = s.get("type")
    if t is None:
        return v
    ts = t if isinstance(t, list) else [t]
    for one in ts:
        ok, conv = _convert(one, s, v)
        if ok:
            return conv
    raise ToolArgumentError(f"must be {_describe(s)}, got {_show(v)}")


def _convert(t: str, s: JSON, v: Any) -> tuple[bool, Any]:
    if t == "null":
        return v is None, None
    if t == "string":
        return isinstance(v, str), v
    if t == "boolean":
        if isinstance(v, bool):
            return True, v
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return True, v.strip().lower() == "true"
        return False, None
    if t in ("integer", "number"):
        return _convert_number(t, v)
    if t == "array":
        if not isinstance(v, list):
            return False, None
        if "prefixItems" in s:
            if len(v) != len(s["prefixItems"]):
                return False, None
            return True, [
                _item(sub, x, i) for i, (sub, x) in enumerate(zip(s["prefixItems"], v, strict=True))
            ]
        return True, [_item(s.get("items", {}), x, i) for i, x in enumerate(v)]
    if t == "object":
        if not isinstance(v, dict):
            return False, None
        sub = s.get("additionalProperties", {})
        return True, {k: _item(sub, x, k) for k, x in v.items()}
    return False, None


def _item(s: JSON, v: Any, where: int | str) -> Any:
    try:
        return _check(s, v)
    except ToolArgumentError as e:
        raise ToolArgumentError(f"item {where!r} {e}") from None


def _convert_number(t: str, v: Any) -> tuple[bool, Any]:
    if isinstance(v, bool):
        return False, None
    if isinstance(v, str):
        try:
            v = float(v) if any(c in v for c in ".eE") else int(v)
        except ValueError:
            return False, None
    if isinstance(v, int):
        return True, v if t == "integer" else float(v)
    if isinstance(v, float):
        if t == "number":
            return True, v
        return (True, int(v)) if v.is_integer() else (False, None)
    return False, None
