"""Tool-call parsers: well-formed, several, malformed and truncated calls never slip through."""

from __future__ import annotations

import pytest

from agentrl.tool_parsers import (
    TOOL_PARSERS,
    ParsedAction,
    ToolParser,
    format_error_observation,
    get_tool_parser,
    parse,
    parse_to_message,
    register_tool_parser,
)
from agentrl.types import ToolCall

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'


def calls(p: ParsedAction) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in p.tool_calls]


def test_hermes_single_and_several_calls_keep_the_content_outside() -> None:
    p = parse(f"Let me compute.\n{CALC}")
    assert p.content == "Let me compute."
    assert calls(p) == [("calculator", {"expression": "2 + 3"})] and p.errors == [] and p.ok
    text = (
        'First <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> then '
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call> done'
    )
    p = parse(text)
    assert calls(p) == [("a", {"x": 1}), ("b", {"y": [1, 2]})]  # double-encoded args are decoded
    assert p.content == "First  then  done"
    assert len({c.id for c in p.tool_calls}) == 2
    plain = parse("Answer: 5")
    assert plain == ParsedAction(content="Answer: 5")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {"x": 1}}</tool_call>', "has no 'name'"),
        ('<tool_call>["calculator"]</tool_call>', "must be a JSON object"),
        (
            '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
            "must be a JSON object, got list",
        ),
        ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', "are not valid JSON"),
        ('<tool_call>{"name": "calculator", "arguments": {}}', "never closed"),
        ("oops</tool_call> after", "without a matching <tool_call>"),
    ],
)
def test_hermes_malformed_calls_become_errors(text: str, error: str) -> None:
    p = parse(text, "stop")
    assert p.tool_calls == []
    assert len(p.errors) == 1 and error in p.errors[0], p.errors
    assert not p.ok


def test_hermes_good_calls_survive_next_to_a_bad_one() -> None:
    p = parse(CALC + '<tool_call>{"name": }</tool_call>')
    assert calls(p) == [("calculator", {"expression": "2 + 3"})]
    assert len(p.errors) == 1 and "not valid JSON" in p.errors[0]


def test_truncated_call_is_reported_not_run() -> None:
    text = 'Sure. <tool_call>{"name": "calculator", "arguments": {"expr'
    p = parse(text, "length")
    assert p.tool_calls == [] and p.content == "Sure."
    assert "length limit" in p.errors[0] and "not run" in p.errors[0]
    # the same text with finish_reason=stop is an unclosed tag
    assert "never closed" in parse(text, "stop").errors[0]


def test_llama3_json_parser() -> None:
    p = get_tool_parser("llama3_json")
    r = p.parse('{"name": "calculator", "parameters": {"expression": "1+1"}}')
    assert calls(r) == [("calculator", {"expression": "1+1"})] and r.content == ""
    r = p.parse(
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 2}}'
    )
    assert calls(r) == [("a", {}), ("b", {"x": 2})]
    assert p.parse("The answer is 2.") == ParsedAction(content="The answer is 2.")
    assert "length limit" in p.parse('{"name": "a", "param', "length").errors[0]
    bad = p.parse('{"name": "a", "parameters": {]}')
    assert bad.tool_calls == [] and "not valid JSON" in bad.errors[0]
    assert "has no 'name'" in p.parse('{"parameters": {}}').errors[0]


def test_xml_function_parser() -> None:
    p = get_tool_parser("xml_function")
    text = (
        "I will edit.\n<tool_call>\n<function=str_replace>\n<parameter=path>\n/a.py\n</parameter>\n"
        "<parameter=count>\n3\n</parameter>\n<parameter=old>\n  x = 1\n\n</parameter>\n</function>\n</tool_call>"
    )
    r = p.parse(text)
    assert r.content == "I will edit."
    assert calls(r) == [("str_replace", {"path": "/a.py", "count": 3, "old": "  x = 1\n"})]
    assert r.errors == []
    cut = p.parse("<function=bash>\n<parameter=cmd>\nls -", "length")
    assert cut.tool_calls == [] and "length limit" in cut.errors[0]
    unclosed = p.parse("<function=bash>\n<parameter=cmd>\nls\n</function>")
    assert unclosed.tool_calls == [] and "never closed" in unclosed.errors[0]
    assert "no tool name" in p.parse("<function=><parameter=a>1</parameter></function>").errors[0]


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "xml_function"])
def test_format_call_round_trips(name: str) -> None:
    p = get_tool_parser(name)
    call = ToolCall(name="edit", arguments={"path": "a b.txt", "n": 2, "items": [1, "x"]})
    assert calls(p.parse(p.format_call(call))) == [("edit", call.arguments)]


def test_parse_to_message_and_error_observation() -> None:
    msg, errors = parse_to_message(f"Checking. {CALC}", "stop")
    assert msg.role == "assistant" and msg.content == "Checking."
    assert [tc.name for tc in msg.tool_calls] == ["calculator"] and errors == []
    msg, errors = parse_to_message('<tool_call>{"name": "x", "arguments": {', "length")
    assert msg.tool_calls == () and len(errors) == 1
    obs = format_error_observation(errors, hint=get_tool_parser().format_hint)
    assert obs.role == "user"
    assert errors[0] in obs.text and "nothing was run" in obs.text and "<tool_call>" in obs.text


def test_custom_parser_registration() -> None:
    class AtParser(ToolParser):
        name = "at"

        def parse(self, text: str, finish_reason: str = "stop") -> ParsedAction:
            if text.startswith("@"):
                return ParsedAction(content="", tool_calls=[ToolCall(name=text[1:], arguments={})])
            return ParsedAction(content=text)

    register_tool_parser("test-at", AtParser)
    try:
        assert calls(parse("@ping", parser="test-at")) == [("ping", {})]
    finally:
        TOOL_PARSERS.unregister("test-at")
