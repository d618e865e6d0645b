"""Tools: typed Python functions the model can call, grouped in tool sets.

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "(3 + 4) * 5".
        '''

    tools = ToolSet([calculator])
    tools.schemas()                               # -> chat template ``tools=``
    result = await tools.call(tool_call)          # ToolCall -> ToolResult, never raises
    message = tools.to_message(tool_call, result) # -> Message(role="tool")

How data moves: the model's text becomes a ``ToolCall`` (``agentrl/tool_parsers.py``);
``ToolSet.call`` finds the ``Tool``, validates the arguments against its JSON schema, runs
the function (sync functions in a worker thread, under ``timeout_s``) and returns a
``ToolResult``. Anything the model did wrong (unknown tool, bad arguments, an exception in
the tool, a timeout) becomes ``ToolResult(is_error=True)`` with a message the model reads.
Two things propagate instead, because they are not the model's fault: ``SandboxError``
(the machinery failed -> ``RolloutStatus.ERROR_SANDBOX``) and a missing injected argument
(a wiring bug -> ``ToolError``).

Injected arguments: a parameter named in ``@tool(inject=("sandbox",))`` or annotated
``Injected[T]`` is hidden from the schema and supplied by the caller at call time
(``await tools.call(tc, sandbox=sb)``); this is how sandboxed tools get their sandbox.
An injected parameter with a default may be left out. By convention AgentLoops and
``Env.acall_tools`` offer ``env=`` (the env of the episode) and AgentLoops ``sample=``.

The schema builder (``agentrl/tool_schema.py``) turns type hints and Google-style
docstrings into JSON schema and validates arguments against it.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import functools
import inspect
import json
import logging
import sys
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, overload

from agentrl.errors import SandboxError, ToolError
from agentrl.registry import Registry, load_entry_point
from agentrl.tool_schema import Injected, ToolArgumentError, function_schema, validate_arguments
from agentrl.types import JSON, Message, ToolCall

logger = logging.getLogger(__name__)

__all__ = [
    "TOOLS",
    "Injected",
    "Tool",
    "ToolArgumentError",
    "ToolResult",
    "ToolSet",
    "get_tool",
    "register_tool",
    "tool",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """What a tool call produced: the text the model sees and whether it failed.

    ``metadata`` is for the env and metrics (exit codes, timings, the raw value); the model
    never sees it.
    """

    content: str
    is_error: bool = False
    metadata: JSON = field(default_factory=dict)


class Tool:
    """A Python function the model can call, with the JSON schema the model sees.

    Build one with ``@tool``; calling ``tool_obj(...)`` directly calls the function.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        inject: Iterable[str] = (),
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        schema = function_schema(fn, inject=tuple(inject))
        self.description: str = description if description is not None else schema.description
        self.parameters: JSON = schema.parameters
        self.inject: tuple[str, ...] = schema.injected
        params = inspect.signature(fn).parameters
        self._inject_required = tuple(
            k for k in self.inject if params[k].default is inspect.Parameter.empty
        )
        self._enums = {
            k: h
            for k, h in typing.get_type_hints(fn).items()
            if isinstance(h, type)
            and issubclass(h, enum.Enum)
            and k in self.parameters["properties"]
        }
        self.timeout_s = timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def schema(self) -> JSON:
        """The OpenAI function-tool dict (what chat templates take as ``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def __reduce__(self) -> str | tuple[Any, ...]:
        # ``@tool`` replaces the module's function with this Tool, so plain pickling of
        # ``self.fn`` fails; a module-level tool pickles as a reference to itself.
        module = sys.modules.get(self.fn.__module__)
        if module is not None and getattr(module, self.fn.__qualname__, None) is self:
            return (load_entry_point, (f"{self.fn.__module__}:{self.fn.__qualname__}",))
        return object.__reduce__(self)

    async def call(self, arguments: JSON, **injected: Any) -> ToolResult:
        """Validate ``arguments``, run the function and wrap what it returned.

        Returns ``ToolResult(is_error=True)`` for bad arguments, exceptions and timeouts.
        Raises ``ToolError`` if an injected argument without a default is missing, and lets
        ``SandboxError`` through (the sandbox failed, not the model).
        """
        missing = [k for k in self._inject_required if k not in injected]
        if missing:
            raise ToolError(
                f"tool {self.name!r} needs injected argument(s) {missing}; pass them to "
                f"call(), e.g. await tools.call(tool_call, {missing[0]}=...)"
            )
        try:
            kwargs = validate_arguments(self.name, self.parameters, arguments)
        except ToolArgumentError as e:
            return ToolResult(content=f"Error: {e}", is_error=True, metadata={"error": "arguments"})
        kwargs.update({k: self._enums[k](v) for k, v in kwargs.items() if k in self._enums})
        kwargs.update({k: injected[k] for k in self.inject if k in injected})
        try:
            value = await asyncio.wait_for(self._run(kwargs), timeout=self.timeout_s)
        except TimeoutError:
            msg = f"Error: tool {self.name!r} timed out after {self.timeout_s:g}s."
            return ToolResult(content=msg, is_error=True, metadata={"error": "timeout"})
        except SandboxError:
            raise
        except Exception as e:
            logger.debug("tool %s raised", self.name, exc_info=True)
            msg = f"Error: {type(e).__name__}: {e}"
            return ToolResult(content=msg, is_error=True, metadata={"error": "exception"})
        return _to_result(value)

    def _run(self, kwargs: JSON) -> Awaitable[Any]:
        if self.is_async:
            return self.fn(**kwargs)  # type: ignore[no-any-return]
        return asyncio.to_thread(self.fn, **kwargs)


def _to_result(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(content=value)
    if value is None:
        return ToolResult(content="")
    try:
        return ToolResult(content=json.dumps(value), metadata={"value": value})
    except (TypeError, ValueError):
        return ToolResult(content=str(value))


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    inject: Iterable[str] = (),
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    inject: Iterable[str] = (),
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed, documented sync or async function into a ``Tool``.

    Use bare (``@tool``) or with options (``@tool(name="calc", timeout_s=5, inject=("sandbox",))``).
    The description is the docstring's text before ``Args:``; each parameter's description
    comes from its ``Args:`` entry; parameters with defaults are optional.
    """
    inject = tuple(inject)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, timeout_s=timeout_s, inject=inject)

    return wrap(fn) if fn is not None else wrap


class ToolSet:
    """A named group of tools: what an env offers the model.

    ``call`` never raises for the model's mistakes; see the module docstring.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = (), *, name: str = "tools"):
        self.name = name
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (a plain function is wrapped with ``@tool``); names must be unique."""
        t = t if isinstance(t, Tool) else tool(t)
        if t.name in self._tools:
            raise ToolError(f"tool set {self.name!r} already has a tool named {t.name!r}")
        self._tools[t.name] = t
        return t

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolSet({self.name!r}, {self.names})"

    def schemas(self) -> list[JSON]:
        """OpenAI function-tool dicts, for the chat template's ``tools=``."""
        return [t.schema for t in self._tools.values()]

    async def call(self, tool_call: ToolCall, **injected: Any) -> ToolResult:
        """Run one call. ``injected`` may hold more than a tool needs; each gets its own."""
        t = self._tools.get(tool_call.name)
        if t is None:
            return ToolResult(
                content=f"Error: {_unknown_tool_message(tool_call.name, self.names)}",
                is_error=True,
                metadata={"error": "unknown_tool"},
            )
        return await t.call(
            tool_call.arguments, **{k: injected[k] for k in t.inject if k in injected}
        )

    def to_message(self, tool_call: ToolCall, result: ToolResult) -> Message:
        """The tool message the model sees for ``result``."""
        return Message(
            role="tool", content=result.content, tool_call_id=tool_call.id, name=tool_call.name
        )

    async def run(self, tool_calls: Iterable[ToolCall], **injected: Any) -> list[Message]:
        """Run calls in order (tools may share state) and return their tool messages."""
        out = []
        for tc in tool_calls:
            out.append(self.to_message(tc, await self.call(tc, **injected)))
        return out


def _unknown_tool_message(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    msg = f"no tool named {name!r}."
    if close:
        msg += f" Did you mean {close[0]!r}?"
    return msg + f" Available tools: {', '.join(known) or '(none)'}."


TOOLS: Registry[Tool] = Registry(
    "tool",
    entry_point_group="agentrl.tools",
    hint="See `agentrl tools list`.",
)


def register_tool(t: Tool | str, *, name: str | None = None, description: str = "") -> None:
    """Register a ``Tool`` (or a lazy ``"module:attr"`` string naming one) under ``name``."""
    if isinstance(t, str):
        if name is None:
            raise ToolError(f"register_tool({t!r}) with a lazy string needs name=")
        TOOLS.register(name, t, description=description)
        return
    TOOLS.register(name or t.name, t, description=description or t.description)


def get_tool(name: str) -> Tool:
    """Look up a registered tool (importing it if registered lazily)."""
    obj = TOOLS.get(name)
    return obj if isinstance(obj, Tool) else tool(obj)
