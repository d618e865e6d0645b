"""Tool-call parsers: the model's completion text -> content + ToolCalls + errors.

    parser = get_tool_parser("hermes")
    parsed = parser.parse(text, finish_reason="stop")   # ParsedAction(content, tool_calls, errors)
    message, errors = parser.parse_to_message(text, finish_reason)
    if errors:
        observation = format_error_observation(errors, hint=parser.format_hint)

One parser per model family, in a registry (``register_tool_parser``; third-party packages use
the ``agentrl.tool_parsers`` entry-point group):

- ``hermes``: Qwen / Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number.
- ``llama3_json``: Llama 3 style, a bare JSON object ``{"name": ..., "parameters": {...}}`` (optionally
  after ``<|python_tag|>``), or several separated by ``;``.
- ``xml_function``: Qwen3-Coder / R2E style
  ``<function=name><parameter=x>value</parameter></function>`` (optionally inside ``<tool_call>``).

A malformed call (bad JSON, no name, an unclosed tag) or a truncated one (``finish_reason ==
"length"`` inside an open call) becomes an error string: it is never dropped silently and
never executed. The env or AgentLoop shows the errors to the model with
``format_error_observation`` and counts them as a metric. ``content`` is the text outside calls.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.registry import Registry
from agentrl.types import JSON, Message, ToolCall


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedAction:
    """A parsed completion: the text outside tool calls, the well-formed calls, the errors."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class ToolParser(ABC):
    """Parses one model family's tool-call syntax. Subclass, set ``name``, implement ``parse``."""

    name: ClassVar[str] = ""
    format_hint: ClassVar[str] = ""  # how a call should look; shown to the model after an error

    @abstractmethod
    def parse(self, text: str, finish_reason: str = "stop") -> ParsedAction:
        """Split ``text`` into content, tool calls and errors; never raises on model output."""

    def format_call(self, call: ToolCall) -> str:
        """The text this family writes for ``call`` (for tests and text-only demonstrations)."""
        raise NotImplementedError(f"{type(self).__name__} cannot format calls")

    def parse_to_message(
        self, text: str, finish_reason: str = "stop", *, reasoning_content: str | None = None
    ) -> tuple[Message, list[str]]:
        """The assistant ``Message`` (content + well-formed calls) and the parse errors."""
        p = self.parse(text, finish_reason)
        msg = Message(
            role="assistant",
            content=p.content,
            tool_calls=tuple(p.tool_calls),
            reasoning_content=reasoning_content,
        )
        return msg, list(p.errors)


def _call_from_obj(
    obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ToolCall | str:
    """A ToolCall from a decoded JSON object, or an error string."""
    if not isinstance(obj, dict):
        return f"a tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call {json.dumps(obj)[:120]} has no 'name'"
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return f"arguments of tool call {name!r} are not valid JSON: {e.msg}"
    if not isinstance(args, dict):
        return f"arguments of tool call {name!r} must be a JSON object, got {type(args).__name__}"
    return ToolCall(name=name, arguments=args)


def _collect(r: ToolCall | str, calls: list[ToolCall], errors: list[str]) -> None:
    if isinstance(r, ToolCall):
        calls.append(r)
    else:
        errors.append(r)


def _truncation_error(tag: str) -> str:
    return f"the response ended (length limit) inside an unfinished {tag} tool call; it was not run"


class HermesParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/3, Hermes)."""

    name = "hermes"
    format_hint = 'Call a tool with <tool_call>{"name": "...", "arguments": {...}}</tool_call>.'
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def parse(self, text: str, finish_reason: str = "stop") -> ParsedAction:
        content: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            stray = text.find(self.close_tag, pos)
            if stray != -1 and (start == -1 or stray < start):
                errors.append(f"found {self.close_tag} without a matching {self.open_tag}")
                content.append(text[pos:stray])
                pos = stray + len(self.close_tag)
                continue
            if start == -1:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            end = text.find(self.close_tag, start)
            body = text[start + len(self.open_tag) : end if end != -1 else len(text)]
            if end == -1:
                errors.append(
                    _truncation_error(self.open_tag)
                    if finish_reason == "length"
                    else f"{self.open_tag} was never closed with {self.close_tag}"
                )
                break
            pos = end + len(self.close_tag)
            self._parse_body(body, calls, errors)
        return ParsedAction(content="".join(content).strip(), tool_calls=calls, errors=errors)

    def _parse_body(self, body: str, calls: list[ToolCall], errors: list[str]) -> None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(
                f"tool call is not valid JSON ({e.msg} at char {e.pos}): {body.strip()[:120]}"
            )
            return
        _collect(_call_from_obj(obj), calls, errors)

    def format_call(self, call: ToolCall) -> str:
        body = json.dumps({"name": call.name, "arguments": call.arguments})
        return f"{self.open_tag}{body}{self.close_tag}"


class Llama3JsonParser(ToolParser):
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}``, ``;``-separated."""

    name = "llama3_json"
    format_hint = 'Call a tool by replying with only {"name": "...", "parameters": {...}}.'
    python_tag = "<|python_tag|>"

    def parse(self, text: str, finish_reason: str = "stop") -> ParsedAction:
        stripped = text.strip()
        tagged = stripped.startswith(self.python_tag)
        if tagged:
            stripped = stripped[len(self.python_tag) :].strip()
        if not stripped.startswith("{"):
            return ParsedAction(content=text.strip())
        calls: list[ToolCall] = []
        errors: list[str] = []
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(stripped):
            try:
                obj, end = decoder.raw_decode(stripped, pos)
            except json.JSONDecodeError as e:
                if finish_reason == "length":
                    errors.append(_truncation_error("JSON"))
                else:
                    errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
                break
            _collect(_call_from_obj(obj), calls, errors)
            pos = end
            while pos < len(stripped) and stripped[pos] in " \n\t;":
                pos += 1
        return ParsedAction(content="", tool_calls=calls, errors=errors)

    def format_call(self, call: ToolCall) -> str:
        return json.dumps({"name": call.name, "parameters": call.arguments})


_FUNCTION = re.compile(r"<function=([^>\s]*)>(.*?)(</function>|$)", re.S)
_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)(</parameter>|$)", re.S)


class XmlFunctionParser(ToolParser):
    """``<function=name><parameter=x>value</parameter></function>`` (Qwen3-Coder, R2E-Gym).

    Parameter values are taken as JSON when they parse as JSON (numbers, lists, objects),
    otherwise as raw text with one leading and trailing newline removed.
    """

    name = "xml_function"
    format_hint = "Call a tool with <function=NAME><parameter=ARG>value</parameter></function>."

    def parse(self, text: str, finish_reason: str = "stop") -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        content_parts: list[str] = []
        pos = 0
        for m in _FUNCTION.finditer(text):
            content_parts.append(text[pos : m.start()])
            pos = m.end()
            name, body, closed = m.group(1), m.group(2), m.group(3)
            if not closed:
                errors.append(
                    _truncation_error("<function=...>")
                    if finish_reason == "length"
                    else f"<function={name}> was never closed with </function>"
                )
                break
            if not name:
                errors.append("a <function=...> tag has no tool name")
                continue
            args: JSON = {}
            bad = False
            for pm in _PARAM.finditer(body):
                if not pm.group(3):
                    errors.append(f"<parameter={pm.group(1)}> in {name!r} was never closed")
                    bad = True
                    break
                args[pm.group(1)] = _param_value(pm.group(2))
            if not bad:
                calls.append(ToolCall(name=name, arguments=args))
        content_parts.append(text[pos:])
        content = "".join(content_parts).replace("<tool_call>", "").replace("</tool_call>", "")
        return ParsedAction(content=content.strip(), tool_calls=calls, errors=errors)

    def format_call(self, call: ToolCall) -> str:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in call.arguments.items()
        )
        return f"<function={call.name}>\n{params}</function>"


def _param_value(raw: str) -> Any:
    v = raw[1:] if raw.startswith("\n") else raw
    v = v[:-1] if v.endswith("\n") else v
    s = v.strip()
    if s and (s[0] in "[{-0123456789" or s in ("true", "false", "null")):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            pass
    return v


def format_error_observation(errors: list[str], *, hint: str = "") -> Message:
    """The message the model sees when its tool call(s) could not be parsed."""
    lines = ["Your tool call could not be parsed, so nothing was run:"]
    lines += [f"- {e}" for e in errors]
    if hint:
        lines.append(hint)
    return Message(role="user", content="\n".join(lines))


TOOL_PARSERS: Registry[ToolParser] = Registry(
    "tool parser", entry_point_group="agentrl.tool_parsers"
)
TOOL_PARSERS.register("hermes", HermesParser, description=HermesParser.__doc__ or "")
TOOL_PARSERS.register("llama3_json", Llama3JsonParser, description=Llama3JsonParser.__doc__ or "")
TOOL_PARSERS.register(
    "xml_function", XmlFunctionParser, description=XmlFunctionParser.__doc__ or ""
)


def register_tool_parser(
    name: str, parser: type[ToolParser] | str, *, description: str = ""
) -> None:
    """Register a parser class (or a lazy ``"module:Class"`` string) under ``name``."""
    TOOL_PARSERS.register(name, parser, description=description)


def get_tool_parser(name: str = "hermes") -> ToolParser:
    """A parser instance for a model family; unknown names say "did you mean"."""
    return TOOL_PARSERS.make(name)


def parse(text: str, finish_reason: str = "stop", *, parser: str = "hermes") -> ParsedAction:
    """Parse ``text`` with the named parser (default ``hermes``)."""
    return get_tool_parser(parser).parse(text, finish_reason)


def parse_to_message(
    text: str, finish_reason: str = "stop", *, parser: str = "hermes"
) -> tuple[Message, list[str]]:
    """Parse ``text`` into an assistant ``Message`` and the list of parse errors."""
    return get_tool_parser(parser).parse_to_message(text, finish_reason)
