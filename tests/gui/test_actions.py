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
