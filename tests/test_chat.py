"""ChatTemplate: structure probing, prefix-preservation detection, deltas, ledger checks."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatTemplate
from agentrl.errors import TokenizationError
from agentrl.rollout.testing import FORCED_THINK_TEMPLATE, THINK_STRIPPING_TEMPLATE
from agentrl.tiny import CHATML_TOOLS_TEMPLATE, build_tokenizer
from agentrl.types import Message, ToolCall, assistant, system, user

THINK_STRIPPING = THINK_STRIPPING_TEMPLATE
FORCED_THINK = FORCED_THINK_TEMPLATE
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_tokenizer()


def test_templates_are_as_the_tests_assume() -> None:
    assert THINK_STRIPPING != CHATML_TOOLS_TEMPLATE and "split('</think>')" in THINK_STRIPPING
    assert FORCED_THINK != CHATML_TOOLS_TEMPLATE


def test_chatml_structure_and_prefix_preserving(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer)
    assert ct.generation_prompt == "<|im_start|>assistant\n"
    assert ct.assistant_suffix == "<|im_end|>\n"
    assert ct.content_prefix == ""
    assert ct.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert len(ct.generation_prompt_ids) > 1
    assert ct.is_prefix_preserving()


def test_think_stripping_template_is_detected(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer, chat_template=THINK_STRIPPING)
    msgs = [user("q1"), assistant("<think>\nr\n</think>\n\na1"), user("q2")]
    assert "<think>" not in ct.render_text(msgs)  # history rewritten
    assert not ct.is_prefix_preserving()
    with pytest.raises(TokenizationError, match="per-turn"):
        ct._delta_text_full(msgs[:2], msgs[2:], None)


def test_forced_think_generation_prompt(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer, chat_template=FORCED_THINK)
    assert ct.generation_prompt == "<|im_start|>assistant\n<think>\n"
    assert ct.content_prefix == "<think>\n"
    assert ct.is_prefix_preserving()
    completion = ct.encode("reasoning\n</think>\n\n42<|im_end|>")
    assert ct.completion_text(completion) == "<think>\nreasoning\n</think>\n\n42"


def _ledger(ct: ChatTemplate, turns: list[tuple[list[Message], str, bool]], tools=None):  # type: ignore[no-untyped-def]
    """Build a ledger the way RolloutContext does: render, then completion + deltas."""
    messages: list[Message] = []
    ids: list[int] = []
    last: list[int] | None = None
    for new, completion_text, ends in turns:
        if last is None:
            messages += new
            ids = ct.render(messages, tools, add_generation_prompt=True)
        else:
            ids += ct.delta_ids(messages, new, tools, last_completion_ids=last)
            messages += new
        comp = ct.encode(completion_text) + (list(ct.stop_token_ids[:1]) if ends else [])
        ids += comp
        last = comp
        messages.append(Message(role="assistant", content=ct.completion_text(comp)))
    return messages, ids


@pytest.mark.parametrize("template", [None, FORCED_THINK])
@pytest.mark.parametrize("ends_with_eos", [True, False])
def test_delta_ledger_matches_full_render(tokenizer, template, ends_with_eos) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer, chat_template=template)
    turns = [
        ([system("sys"), user("What is 3 + 4?")], "Let me compute.", ends_with_eos),
        ([Message(role="tool", content="7", tool_call_id="c1")], "It is 7", ends_with_eos),
        ([user("Thanks! And 2 * 5?")], "10", True),
    ]
    messages, ids = _ledger(ct, turns, TOOLS)
    check = ct.check_ledger(messages, ids, TOOLS)
    assert check.ok, check.mismatch
    # the ledger is token-identical to a full render (canonical tokenization here)
    full = ct.render(messages, TOOLS)
    assert ids == full[: len(ids)]
    closing = ct.closing_ids(ct.encode("x") + list(ct.stop_token_ids))
    assert ct.decode(closing) == "\n"
    assert ct.decode(ct.closing_ids(ct.encode("x"))) == "<|im_end|>\n"


def test_fast_delta_agrees_with_full_diff_and_is_cached(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer)
    prev = [
        user("q"),
        assistant("a", (ToolCall(name="calculator", arguments={"expression": "1"}),)),
    ]
    new = [Message(role="tool", content="1", tool_call_id="x")]
    fast = ct._delta_text_fast(new)
    assert fast == ct._delta_text_full(prev, new, TOOLS)
    ct.delta_ids(prev, new, TOOLS)
    assert ct._fast_ok[(("tool",), True)] is True


def test_check_ledger_reports_the_mismatching_token(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer)
    messages, ids = _ledger(ct, [([user("hello")], "the answer is 42", True)])
    assert ct.check_ledger(messages, ids).ok
    pos = len(ct.render([user("hello")], add_generation_prompt=True))
    bad = list(ids)
    bad[pos + 1] = ct.encode("Z")[0]
    check = ct.check_ledger(messages, bad)
    assert not check.ok and check.mismatch is not None
    assert check.mismatch.token_index == pos + 1
    with pytest.raises(TokenizationError, match=f"token {pos + 1}"):
        check.raise_for_mismatch()
    # a ledger that stops before the last completion is incomplete
    assert not ct.check_ledger(messages, ids[: pos - 1]).ok


def test_deltas_with_different_tool_sets_share_one_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer)
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "a_much_longer_tool_name"}}]
    for tools in (TOOLS, other, None, TOOLS):
        msgs, ids = _ledger(
            ct,
            [
                ([user("q")], "a", True),
                ([Message(role="tool", content="r", tool_call_id="c")], "b", True),
            ],
            tools,
        )
        assert ct.check_ledger(msgs, ids, tools).ok
        assert ids == ct.render(msgs, tools)[: len(ids)]


def test_template_that_rejects_system_messages_is_still_probed(tokenizer) -> None:  # type: ignore[no-untyped-def]
    no_system = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}" + CHATML_TOOLS_TEMPLATE
    )
    ct = ChatTemplate(tokenizer, chat_template=no_system)
    with pytest.raises(Exception, match="System role"):
        ct.render_text([system("s"), user("u")])
    assert ct.is_prefix_preserving()


def test_the_rust_tokenizer_is_used_only_where_it_matches_the_wrapper(tokenizer) -> None:  # type: ignore[no-untyped-def]
    import random

    from agentrl.rust_tokenizer import rust_backend

    assert rust_backend(tokenizer, clean_up=False) is tokenizer._tokenizer
    fast = ChatTemplate(tokenizer)
    rng = random.Random(0)
    alphabet = "ab zé🙂,.\n<>|_0123456789"
    for _ in range(50):  # random text and ids: the fast path gives the wrapper's answers
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        assert fast.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
        expected = tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert fast.decode(ids) == expected

    class EncodesDifferently:  # an HF wrapper that changes the text before its Rust object
        _tokenizer = tokenizer._tokenizer

        def __getattr__(self, name: str) -> object:
            return getattr(tokenizer, name)

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return list(
                tokenizer.encode(text.replace("  ", " "), add_special_tokens=add_special_tokens)
            )

    wrapper = EncodesDifferently()
    assert rust_backend(wrapper, clean_up=False) is None
    assert ChatTemplate(wrapper).encode("a  b") == wrapper.encode("a  b", add_special_tokens=False)
    assert rust_backend(object()) is None  # a slow (pure Python) tokenizer has no Rust object
