"""Pruning and rendering the page's element tree, on a fixture snapshot (no browser)."""

from __future__ import annotations

from typing import Any

from envs.gui.tree import find, label, prune, render, walk


def el(
    role: str, name: str = "", id: int | None = None, *children: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    return {"role": role, "name": name, "id": id, "children": list(children), **kw}


def text(t: str) -> dict[str, Any]:
    return {"role": "text", "name": t, "children": []}


# a login page as SNAPSHOT_JS returns it: anonymous divs, labels, hidden parts, long text
SNAPSHOT = el(
    "",
    "",
    None,
    el("", "", None, el("heading", "Sign in", 1, text("Sign in"))),
    el(
        "form",
        "",
        2,
        el("label", "Username", 3, text("Username"), labels=True),
        el("textbox", "Username", 4, value="mi"),
        el(
            "label",
            "Remember me",
            5,
            el("checkbox", "Remember me", 6, checked=False),
            text("Remember me"),
            labels=True,
        ),
        el("button", "Sign in", 7, text("Sign in"), focused=True),
        el("button", "Hidden", 8, hidden=True),
        el("", "", None, hidden=True, children=[el("link", "Secret", 9)]),
        el("button", "Later", 10, disabled=True),
    ),
    el(
        "paragraph",
        "",
        11,
        text("Trouble?"),
        el("link", "Forgot password?", 12, text("Forgot password?")),
    ),
    el("paragraph", "", 13, text("A " * 60)),
    el("list", "", 14),  # empty: dropped
    el("", "", None, text("loose text")),
)


def test_prune_keeps_what_an_agent_reads_and_acts_on() -> None:
    nodes = prune(SNAPSHOT)
    assert render(nodes).splitlines() == [
        '[1] heading "Sign in"',
        "[2] form",
        '  [4] textbox "Username" value="mi"',
        '  [6] checkbox "Remember me" unchecked',
        '  [7] button "Sign in" focused',
        '  [10] button "Later" disabled',
        "[11] paragraph",
        '  "Trouble?"',
        '  [12] link "Forgot password?"',
        '[13] paragraph "' + ("A " * 60)[:77] + '..."',
        '"loose text"',
    ]


def test_ids_come_from_the_page_and_find_locates_by_role_and_name() -> None:
    nodes = prune(SNAPSHOT)
    ids = [n.id for n in walk(nodes) if n.id is not None]
    assert ids == [1, 2, 4, 6, 7, 10, 11, 12, 13]
    assert 8 not in ids and 9 not in ids  # hidden, and inside a hidden container
    found = find(nodes, "link", "Forgot")
    assert found is not None and found.id == 12
    assert find(nodes, "button", "Nope") is None


def test_empty_page_renders_nothing() -> None:
    assert render(prune(el("", ""))) == ""


def test_ids_after_names_keep_every_line_and_state() -> None:
    nodes = prune(SNAPSHOT)
    assert render(nodes, ids="after").splitlines() == [
        'heading "Sign in" [1]',
        "form [2]",
        '  textbox "Username" [4] value="mi"',
        '  checkbox "Remember me" [6] unchecked',
        '  button "Sign in" [7] focused',
        '  button "Later" [10] disabled',
        "paragraph [11]",
        '  "Trouble?"',
        '  link "Forgot password?" [12]',
        'paragraph "' + ("A " * 60)[:77] + '..." [13]',
        '"loose text"',
    ]


def test_a_label_names_the_element_as_its_line_does_without_states() -> None:
    box = find(prune(SNAPSHOT), "checkbox", "Remember")
    assert box is not None
    assert label(box) == '[6] checkbox "Remember me"'
    assert label(box, ids="after") == 'checkbox "Remember me" [6]'
