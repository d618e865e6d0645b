"""Parsing a GUI agent's reply into an action (pure Python; no browser)."""

from __future__ import annotations

import pytest

from envs.gui.actions import Action, ActionError, parse_action


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("click(12)", Action(kind="click", element=12)),
        ("I should sign in.\nclick(9)", Action(kind="click", element=9)),
        ("click(3)\nno wait:\nclick(4)", Action(kind="click", element=4)),  # the last one counts
        ("```\nclick(3)\n```", Action(kind="click", element=3)),
        ("`click(5)`", Action(kind="click", element=5)),
        ("click(x=120, y=48.5)", Action(kind="click", x=120.0, y=48.5)),
        ("click(120, 48)", Action(kind="click", x=120.0, y=48.0)),
        ('type(5, "mira okafor")', Action(kind="type", element=5, text="mira okafor")),
        ("type(5, 'it''s')", Action(kind="type", element=5, text="its")),  # adjacent literals
        ('type(5, "")', Action(kind="type", element=5, text="")),
        ('press("Enter")', Action(kind="press", text="Enter")),
        ("press(Tab)", Action(kind="press", text="Tab")),
        ("scroll(down)", Action(kind="scroll", text="down")),
        ('scroll("UP")', Action(kind="scroll", text="up")),
        ('select(7, "Canada")', Action(kind="select", element=7, text="Canada")),
        ("back()", Action(kind="back")),
    ],
)
def test_parses_the_accepted_forms(reply: str, action: Action) -> None:
    assert parse_action(reply) == action
    assert parse_action(str(action)) == action  # str() writes the form the parser reads


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ("", "no action found"),
        ("I am done.", "no action found"),
        ("please click(the button", "no action found"),
        ("click()", "takes 1 argument"),
        ('click("Sign in")', "element id"),
        ("click(-1)", "element id"),
        ("click(True)", "element id"),
        ("click(1, 2, 3)", "takes 1 argument"),
        ("click(x=1)", "two numbers"),
        ('click(x="a", y=2)', "two numbers"),
        ("type(3)", "takes 2 arguments"),
        ("type(3, 4)", "quoted string"),
        ("scroll(left)", '"up" or "down"'),
        ('press("")', "key name"),
        ("back(1)", "takes 0 arguments"),
        ('click(__import__("os"))', "numbers or quoted strings"),
        ("click(1 + 1)", "numbers or quoted strings"),
        ("click(1))", "could not read"),
    ],
)
def test_bad_replies_say_what_is_accepted(reply: str, says: str) -> None:
    with pytest.raises(ActionError) as e:
        parse_action(reply)
    assert says in str(e.value)
    assert "Reply with one action on its own line" in str(e.value)


def test_values_are_written_in_double_quotes_as_the_instructions_quote_them() -> None:
    """The oracle's actions quote values as the instructions, the pages and the action help
    (``type(ID, "text")``) do, so a copied value, quotes included, is the same tokens on both
    sides."""
    from agentrl.tiny import build_tokenizer

    tok = build_tokenizer(1024)

    def ids(text: str) -> list[int]:
        return list(tok(text)["input_ids"])

    def within(part: list[int], whole: list[int]) -> bool:
        return any(whole[i : i + len(part)] == part for i in range(len(whole)))

    for value in ("sofia.kim", "tomas", "Français", 'say "hi"', "it's"):
        action = str(Action(kind="type", element=3, text=value))
        assert parse_action(action) == Action(kind="type", element=3, text=value)
        if '"' not in value:
            assert action == f'type(3, "{value}")'
            quoted = ids(f' "{value}"')
            assert within(quoted, ids(f'Log in as "{value}" now')) and within(quoted, ids(action))
