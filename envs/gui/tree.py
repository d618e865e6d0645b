"""Prune the page's element tree into the text an agent reads; pure Python, no browser needed.

    raw = await page.evaluate(SNAPSHOT_JS)      # envs/gui/session.py: every visible element
    nodes = prune(raw)                          # roles that matter, names, values, ids kept
    text = render(nodes)                        # '[7] textbox "Username" value="al"' ...
    text = render(nodes, ids="after")           # 'textbox "Username" [7] value="al"' ...

The raw tree comes from ``SNAPSHOT_JS`` (``envs/gui/snapshot.js``), which walks the DOM and
gives each element a role (its ARIA ``role``, the implicit role of its tag, or ``clickable``
for an element drawn with a pointer cursor that is no control, like MiniWoB's links), an accessible
name (``aria-label``, its ``<label>``, ``alt``, ``title``, ``placeholder``, or its text for
buttons, links, headings and options; other elements show their text as children), its state and its box in CSS pixels. It is computed
from the DOM by our script, not read from Chromium's own accessibility tree; the ids it hands
out are stable for the life of a page (an element keeps its id across steps, and the same page
built the same way gets the same ids). Pruning keeps what an agent can read or act on and
lifts the children of anonymous containers to their parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

INTERACTIVE = frozenset(
    {
        "link",
        "button",
        "textbox",
        "searchbox",
        "checkbox",
        "radio",
        "combobox",
        "option",
        "menuitem",
        "tab",
        "switch",
        "slider",
        "clickable",
        "spinbutton",
    }
)
STRUCTURAL = frozenset(
    {
        "heading",
        "list",
        "listitem",
        "form",
        "table",
        "row",
        "cell",
        "columnheader",
        "img",
        "dialog",
        "alert",
        "status",
        "navigation",
        "main",
        "paragraph",
        "label",
    }
)
MAX_NAME = 80
IdStyle = Literal["before", "after"]
ID_STYLES: tuple[IdStyle, ...] = ("before", "after")


@dataclass(kw_only=True, slots=True)
class Node:
    """One kept element (or a run of text, ``role == "text"`` and ``id is None``)."""

    id: int | None
    role: str
    name: str = ""
    value: str | None = None
    checked: bool | None = None
    disabled: bool = False
    focused: bool = False
    box: tuple[float, float, float, float] | None = None  # x, y, w, h: viewport CSS pixels
    children: list[Node] = field(default_factory=list)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 3] + "..."


def prune(raw: dict[str, Any]) -> list[Node]:
    """The kept nodes of a raw snapshot (a dict from ``SNAPSHOT_JS``), as a forest."""
    return _prune(raw)


def _prune(raw: dict[str, Any]) -> list[Node]:
    if raw.get("hidden"):
        return []
    role = str(raw.get("role") or "")
    if role == "text":
        text = _clip(str(raw.get("name", "")))
        return [Node(id=None, role="text", name=text)] if text else []
    children = [n for c in raw.get("children", ()) for n in _prune(c)]
    if raw.get("labels"):  # a <label> of a control: the control is named by it already
        return [c for c in children if c.role != "text"]
    name = _clip(str(raw.get("name") or ""))
    if role in INTERACTIVE or role in STRUCTURAL:
        # a named element repeats its own text: drop text children saying the same
        if name:
            children = [c for c in children if not (c.role == "text" and c.name in name)]
        if role in STRUCTURAL and not name:
            if not children:
                return []
            if all(c.role == "text" for c in children):  # plain text: one line
                name, children = _clip(" ".join(c.name for c in children)), []
        box = raw.get("box")
        return [
            Node(
                id=raw.get("id"),
                role=role,
                name=name,
                value=raw.get("value"),
                checked=raw.get("checked"),
                disabled=bool(raw.get("disabled")),
                focused=bool(raw.get("focused")),
                box=tuple(box) if box else None,  # type: ignore[arg-type]
                children=children,
            )
        ]
    return children  # an anonymous container: its children take its place


def render(nodes: list[Node], indent: int = 0, *, ids: IdStyle = "before") -> str:
    """One line per node, children indented: ``[id] role "name" value="..." checked``.

    ``ids="after"`` writes the id after the name, ``role "name" [id] value="..." checked``
    (the order of Playwright's ARIA snapshots, ``link "Home" [ref=e3]``), so a model that
    finds the named element can copy the id that follows the name instead of looking back
    for the one in front of it (measured on CPU: no sooner learnt, docs/guides/gui.md)."""
    lines: list[str] = []
    for n in nodes:
        pad = "  " * indent
        if n.role == "text":
            lines.append(f'{pad}"{n.name}"')
        else:
            parts = [f"[{n.id}] {n.role}"] if ids == "before" else [n.role]
            if n.name:
                parts.append(f'"{n.name}"')
            if ids == "after":
                parts.append(f"[{n.id}]")
            if n.value is not None:
                parts.append(f'value="{_clip(n.value)}"')
            if n.checked is not None:
                parts.append("checked" if n.checked else "unchecked")
            if n.disabled:
                parts.append("disabled")
            if n.focused:
                parts.append("focused")
            lines.append(pad + " ".join(parts))
        if n.children:
            lines.append(render(n.children, indent + 1, ids=ids))
    return "\n".join(line for line in lines if line)


def label(node: Node, *, ids: IdStyle = "before") -> str:
    """How ``render`` names the node, without its value and states: ``[7] button "Go"``
    (``ids="after"``: ``button "Go" [7]``)."""
    return render([Node(id=node.id, role=node.role, name=node.name)], ids=ids)


def walk(nodes: list[Node]) -> list[Node]:
    """Every node of the forest, in document order."""
    out: list[Node] = []
    for n in nodes:
        out.append(n)
        out.extend(walk(n.children))
    return out


def find(nodes: list[Node], role: str, name: str) -> Node | None:
    """The first node with this role whose name contains ``name`` (for scripted policies)."""
    for n in walk(nodes):
        if n.role == role and name in n.name and n.id is not None:
            return n
    return None
