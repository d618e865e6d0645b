"""Parse a GUI agent's reply into one browser action; pure Python, no browser needed.

    parse_action('I will log in.\nclick(12)')        -> Action(kind="click", element=12)
    parse_action('click(x=120, y=48)')               -> Action(kind="click", x=120.0, y=48.0)
    parse_action('type(5, "alice")')                 -> Action(kind="type", element=5, text="alice")
    parse_action('press("Enter")')  scroll(down)  select(7, "Canada")  back()

The last line of the reply that looks like a call to one of ``VERBS`` is the action (an
earlier line may be reasoning). Arguments are Python literals read with ``ast``, never
evaluated; a bare word (``scroll(down)``, ``press(Enter)``) is read as a string. A reply
with no action or with wrong arguments raises ``ActionError`` whose message tells the model
the accepted forms; the env shows it as an observation.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Literal

Verb = Literal["click", "type", "press", "scroll", "select", "back"]
VERBS: tuple[Verb, ...] = ("click", "type", "press", "scroll", "select", "back")
SCROLL_DIRECTIONS = ("up", "down")

HELP = (
    "Reply with one action on its own line: click(ID), click(x=X, y=Y) (screenshot pixels), "
    'type(ID, "text"), press("Enter"), scroll("down") or scroll("up"), '
    'select(ID, "option"), back().'
)

_CALL = re.compile(r"^\s*`{0,3}\s*(" + "|".join(VERBS) + r")\s*\(.*\)\s*`{0,3}\s*$")


class ActionError(ValueError):
    """The reply holds no well-formed action; the message says what was expected."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """One browser action; which fields are set depends on ``kind``."""

    kind: Verb
    element: int | None = None  # the element id shown in the accessibility tree
    x: float | None = None  # screenshot pixels (click by coordinates)
    y: float | None = None
    text: str = ""  # type: text, press: key, scroll: direction, select: option label

    def __str__(self) -> str:
        if self.kind == "click" and self.element is None:
            return f"click(x={self.x:g}, y={self.y:g})"
        args = [str(self.element)] if self.element is not None else []
        if self.kind in ("type", "press", "scroll", "select"):
            args.append(json.dumps(self.text, ensure_ascii=False))  # as HELP writes it
        return f"{self.kind}({', '.join(args)})"


def _value(node: ast.expr) -> object:
    if isinstance(node, ast.Name):  # a bare word: scroll(down), press(Enter)
        return node.id
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand)
        if isinstance(inner, int | float):
            return -inner
    if isinstance(node, ast.Constant):
        return node.value
    raise ActionError(f"arguments must be numbers or quoted strings, got {ast.unparse(node)!r}")


def _element(value: object, verb: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ActionError(
            f"{verb}() needs an element id (a whole number from the tree), got {value!r}"
        )
    return value


def _text(value: object, verb: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{verb}() needs a quoted string, got {value!r}")
    return value


def parse_action(reply: str) -> Action:
    """The action in an assistant reply; ``ActionError`` (with ``HELP``) when there is none."""
    lines = [ln for ln in reply.strip().splitlines() if _CALL.match(ln)]
    if not lines:
        raise ActionError(f"no action found. {HELP}")
    line = lines[-1].strip().strip("`").strip()
    try:
        call = ast.parse(line, mode="eval").body
    except SyntaxError:
        raise ActionError(f"could not read {line!r}. {HELP}") from None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionError(f"could not read {line!r}. {HELP}")
    verb = call.func.id
    try:
        args = [_value(a) for a in call.args]
        kwargs = {k.arg: _value(k.value) for k in call.keywords if k.arg is not None}
        return _build(verb, args, kwargs)
    except ActionError as e:
        raise ActionError(f"{e}. {HELP}") from None


def _build(verb: str, args: list[object], kwargs: dict[str, object]) -> Action:
    if verb == "click":
        if "x" in kwargs or "y" in kwargs or len(args) == 2:
            x = kwargs.get("x", args[0] if args else None)
            y = kwargs.get("y", args[1] if len(args) > 1 else None)
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y)):
                raise ActionError(f"click(x=X, y=Y) needs two numbers, got x={x!r}, y={y!r}")
            assert isinstance(x, int | float) and isinstance(y, int | float)
            return Action(kind="click", x=float(x), y=float(y))
        _arity(verb, args, kwargs, 1)
        return Action(kind="click", element=_element(args[0], verb))
    if verb in ("type", "select"):
        _arity(verb, args, kwargs, 2)
        return Action(kind=verb, element=_element(args[0], verb), text=_text(args[1], verb))  # type: ignore[arg-type]
    if verb == "press":
        _arity(verb, args, kwargs, 1)
        key = _text(args[0], verb)
        if not key.strip():
            raise ActionError("press() needs a key name such as Enter, Tab or ArrowDown")
        return Action(kind="press", text=key)
    if verb == "scroll":
        _arity(verb, args, kwargs, 1)
        direction = _text(args[0], verb).lower()
        if direction not in SCROLL_DIRECTIONS:
            raise ActionError(f'scroll() takes "up" or "down", got {direction!r}')
        return Action(kind="scroll", text=direction)
    _arity(verb, args, kwargs, 0)
    return Action(kind="back")


def _arity(verb: str, args: list[object], kwargs: dict[str, object], n: int) -> None:
    if kwargs or len(args) != n:
        raise ActionError(
            f"{verb}() takes {n} argument{'s' if n != 1 else ''}, got {len(args) + len(kwargs)}"
        )
