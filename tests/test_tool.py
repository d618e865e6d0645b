"""@tool schemas, argument validation, injected arguments and ToolSet error handling."""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Literal, Optional

import pytest

from agentrl.errors import SandboxError, ToolError
from agentrl.tool import Injected, Tool, ToolResult, ToolSet, tool
from agentrl.types import ToolCall


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def search(
    query: str,
    k: int = 3,
    mode: Literal["fast", "deep"] = "fast",
    tags: list[str] | None = None,
    scale: Optional[float] = None,  # noqa: UP045 - the Optional spelling must work too
    color: Color = Color.RED,
    exact: bool = False,
) -> list[str]:
    """Search the index.

    Results are ranked.

    Args:
        query: what to look for,
            possibly several words.
        k (int): how many results.
        mode: speed/quality trade-off.

    Returns:
        the matching documents.
    """
    return [query] * k


def test_schema_from_type_hints_defaults_and_docstring() -> None:
    assert search.name == "search"
    assert search.description == "Search the index.\n\nResults are ranked."
    p = search.parameters
    assert p["type"] == "object" and p["required"] == ["query"]
    props = p["properties"]
    assert props["query"] == {
        "type": "string",
        "description": "what to look for, possibly several words.",
    }
    assert props["k"] == {"type": "integer", "description": "how many results.", "default": 3}
    assert props["mode"]["enum"] == ["fast", "deep"] and props["mode"]["type"] == "string"
    assert props["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert props["scale"] == {"type": ["number", "null"], "default": None}
    assert props["color"]["enum"] == ["red", "blue"]
    assert props["exact"] == {"type": "boolean", "default": False}
    assert "returns" not in str(p).lower()
    assert search.schema == {
        "type": "function",
        "function": {"name": "search", "description": search.description, "parameters": p},
    }


def test_options_name_description_and_direct_call() -> None:
    @tool(name="add_numbers", description="Add two numbers.")
    def add(a: int, b: int = 1) -> int:
        return a + b

    assert isinstance(add, Tool)
    assert add.schema["function"]["name"] == "add_numbers"
    assert add.description == "Add two numbers."
    assert add(2, b=3) == 5  # calling the Tool calls the function


def test_unsupported_annotation_is_a_clear_error() -> None:
    with pytest.raises(ToolError, match="cannot build a JSON schema"):

        @tool
        def bad(x: object) -> str:
            return ""


async def test_arguments_are_validated_with_messages_for_the_model() -> None:
    ok = await search.call({"query": "a", "k": "2", "exact": "true"})
    assert ok == ToolResult(content='["a", "a"]', metadata={"value": ["a", "a"]})

    cases = {
        "missing required argument(s) 'query'": {"k": 1},
        "unknown argument(s) 'limit'": {"query": "a", "limit": 3},
        "argument 'k' must be integer, got str 'many'": {"query": "a", "k": "many"},
        "argument 'k' must be integer, got float 2.5": {"query": "a", "k": 2.5},
        "argument 'mode' must be one of ['fast', 'deep']": {"query": "a", "mode": "slow"},
        "argument 'tags' must be array of string | null": {"query": "a", "tags": "x"},
        "argument 'tags' item 1 must be string, got int 3": {"query": "a", "tags": ["x", 3]},
    }
    for expected, args in cases.items():
        res = await search.call(args)
        assert res.is_error, args
        assert expected in res.content, res.content
        assert res.content.startswith(
            "Error: bad arguments for tool 'search' (expected query: string"
        )
    not_object = await search.call(["a"])  # type: ignore[arg-type]
    assert not_object.is_error and "must be a JSON object" in not_object.content


async def test_injected_arguments_are_hidden_and_supplied_at_call_time() -> None:
    @tool(inject=("sandbox",))
    async def run(cmd: str, sandbox: Any) -> str:
        """Run a command."""
        return f"{sandbox}:{cmd}"

    @tool
    def note(text: str, env: Injected[Any] = None, sample: Injected[Any] = None) -> str:
        """Take a note."""
        return f"{text}|{env}|{sample}"

    assert list(run.parameters["properties"]) == ["cmd"] and run.inject == ("sandbox",)
    assert list(note.parameters["properties"]) == ["text"]
    assert set(note.inject) == {"env", "sample"}

    tools = ToolSet([run, note])
    r = await tools.call(ToolCall(name="run", arguments={"cmd": "ls"}), sandbox="sb", env="E")
    assert r.content == "sb:ls"
    r = await tools.call(ToolCall(name="note", arguments={"text": "t"}), sandbox="sb", env="E")
    assert r.content == "t|E|None"  # each tool gets only what it declares; defaults may be left out
    # the model cannot set an injected argument
    r = await tools.call(
        ToolCall(name="run", arguments={"cmd": "ls", "sandbox": "evil"}), sandbox="sb"
    )
    assert r.is_error and "unknown argument(s) 'sandbox'" in r.content
    with pytest.raises(ToolError, match="needs injected argument"):
        await tools.call(ToolCall(name="run", arguments={"cmd": "ls"}))
    with pytest.raises(ToolError, match="names no parameter"):
        tool(inject=("sandbox",))(lambda x: x)


async def test_toolset_turns_failures_into_error_results() -> None:
    @tool(timeout_s=0.05)
    async def slow() -> str:
        """Never finishes in time."""
        await asyncio.Event().wait()
        return "never"

    @tool
    def boom(x: int) -> str:
        """Always fails."""
        raise RuntimeError(f"kaboom {x}")

    @tool
    def broken_sandbox() -> str:
        """The sandbox died."""
        raise SandboxError("container exited")

    tools = ToolSet([search, slow, boom, broken_sandbox], name="t")
    unknown = await tools.call(ToolCall(name="serch", arguments={}))
    assert unknown.is_error and "no tool named 'serch'. Did you mean 'search'?" in unknown.content
    assert "Available tools: search, slow, boom, broken_sandbox" in unknown.content
    timed_out = await tools.call(ToolCall(name="slow", arguments={}))
    assert timed_out.is_error and "timed out after 0.05s" in timed_out.content
    raised = await tools.call(ToolCall(name="boom", arguments={"x": 7}))
    assert raised == ToolResult(
        content="Error: RuntimeError: kaboom 7", is_error=True, metadata={"error": "exception"}
    )
    with pytest.raises(SandboxError):  # infrastructure failures are not the model's fault
        await tools.call(ToolCall(name="broken_sandbox", arguments={}))


async def test_to_message_run_and_schemas() -> None:
    tools = ToolSet([search])
    call = ToolCall(name="search", arguments={"query": "q", "k": 1}, id="call_7")
    msg = tools.to_message(call, await tools.call(call))
    assert (msg.role, msg.content, msg.tool_call_id, msg.name) == (
        "tool",
        '["q"]',
        "call_7",
        "search",
    )
    msgs = await tools.run([call, ToolCall(name="nope", arguments={}, id="c2")])
    assert [m.tool_call_id for m in msgs] == ["call_7", "c2"] and msgs[1].content.startswith(
        "Error"
    )
    assert tools.schemas() == [search.schema]
    assert "search" in tools and len(tools) == 1 and tools["search"] is search
    with pytest.raises(ToolError, match="already has a tool named"):
        tools.add(search)


async def test_return_values_become_text() -> None:
    @tool
    def returns(kind: str) -> Any:
        """Return different things."""
        return {"none": None, "dict": {"a": 1}, "result": ToolResult(content="x", is_error=True)}[
            kind
        ]

    assert (await returns.call({"kind": "none"})).content == ""
    assert (await returns.call({"kind": "dict"})).content == '{"a": 1}'
    assert (await returns.call({"kind": "result"})) == ToolResult(content="x", is_error=True)


def test_module_level_tools_pickle_by_reference() -> None:
    import pickle

    assert pickle.loads(pickle.dumps(search)) is search
    tools = pickle.loads(pickle.dumps(ToolSet([search])))
    assert tools["search"] is search


async def test_enum_arguments_arrive_as_enum_members() -> None:
    @tool
    def paint(color: Color) -> str:
        """Paint."""
        assert isinstance(color, Color)
        return color.name

    assert (await paint.call({"color": "blue"})).content == "BLUE"
