"""A task page as a document: elements with their form state, the HTML parser that makes
them, and a block-and-line layout that gives each element its box; pure Python (Pillow's
fonts measure the text). ``envs/gui/drawn.py`` builds the element tree and draws on top.

    body, title = parse(html)            # the <body> as El nodes, the <title> text
    layout = Layout(800)
    height = layout.place(body)          # every element's box set; layout.runs: words to draw
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

from PIL import ImageFont

VOID = frozenset({"input", "br", "meta", "link", "img", "hr"})
SKIP = frozenset({"script", "style", "noscript", "template", "head", "meta", "link", "title"})
BLOCK = frozenset(
    {"p", "ul", "ol", "li", "form", "nav", "main", "div", "label", "table", "tr", "dialog"}
    | {f"h{i}" for i in range(1, 7)}
)
FONT_SIZE, H1_SIZE, LINE = 16, 32, 22
MARGIN = 24  # body margin, CSS pixels (tasks.STYLE)
FIELD_W, FIELD_H, CHECK = 180, 26, 13


# --- the document -------------------------------------------------------------------------
@dataclass(eq=False, slots=True)
class El:
    """One element: its tag, attributes, children (elements or text) and form state."""

    tag: str
    attrs: dict[str, str]
    parent: El | None = None
    children: list[El | str] = field(default_factory=list)
    value: str = ""  # an input's value
    checked: bool = False
    selected: int = 0  # a select's option index
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # x, y, w, h: page pixels

    def get(self, name: str, default: str = "") -> str:
        return self.attrs.get(name, default)

    def walk(self) -> list[El]:
        out: list[El] = [self]
        for c in self.children:
            if isinstance(c, El):
                out += c.walk()
        return out

    def text(self) -> str:
        """The element's text, whitespace collapsed (``innerText``, near enough for our pages)."""
        parts = [c if isinstance(c, str) else c.text() for c in self.children]
        return " ".join(" ".join(parts).split())

    @property
    def options(self) -> list[El]:
        return [c for c in self.children if isinstance(c, El) and c.tag == "option"]

    def option_value(self, o: El) -> str:
        return o.attrs["value"] if "value" in o.attrs else o.text()

    @property
    def input_type(self) -> str:
        return self.get("type", "text").lower() if self.tag == "input" else ""

    def ancestor(self, tag: str) -> El | None:
        el = self.parent
        while el is not None and el.tag != tag:
            el = el.parent
        return el


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = El("html", {})
        self.stack = [self.root]
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = El(tag, {k: v if v is not None else "" for k, v in attrs}, parent=self.stack[-1])
        self.stack[-1].children.append(el)
        self._in_title = tag == "title"
        if tag not in VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False
        for i in range(len(self.stack) - 1, 0, -1):  # close up to the matching open tag
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self.stack[-1].children.append(data)


def parse(doc: str) -> tuple[El, str]:
    """The ``<body>`` of an HTML document (the whole document when it has none) and its title."""
    p = _Parser()
    p.feed(doc)
    p.close()
    body = next((e for e in p.root.walk() if e.tag == "body"), p.root)
    for el in p.root.walk():  # form state starts from the markup
        if el.tag == "input":
            el.value, el.checked = el.get("value"), "checked" in el.attrs
        elif el.tag == "select":
            el.selected = next((i for i, o in enumerate(el.options) if "selected" in o.attrs), 0)
    return body, " ".join(p.title.split())


# --- fonts and layout -----------------------------------------------------------------------
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu")


@cache
def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans (``AGENTRL_GUI_FONT_DIR`` or Debian's folder), else Pillow's own font."""
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    dirs = [os.environ.get("AGENTRL_GUI_FONT_DIR", ""), *FONT_DIRS]
    for d in dirs:
        if d and (Path(d) / name).is_file():
            return ImageFont.truetype(str(Path(d) / name), size)
    return ImageFont.load_default(size)


def text_width(text: str, size: int = FONT_SIZE, bold: bool = False) -> float:
    return float(font(size, bold).getlength(text))


Run = tuple[float, float, str, "El"]
"""A word to draw: x, y (page pixels), its text, the element whose text it is."""


class Layout:
    """A block-and-line flow: blocks stack, inline boxes (text, links, controls) fill lines."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.runs: list[Run] = []

    def place(self, body: El) -> float:
        """Give every element under ``body`` its box (``runs``: the words); the page height."""
        height = self.block(body, MARGIN, MARGIN) + MARGIN
        body.box = (0.0, 0.0, float(self.width), height)
        return height

    def block(self, el: El, x: float, y: float) -> float:
        """Lay out ``el``'s children from (x, y); the y under them."""
        cx, line_top, line_h = x, y, 0.0
        right = self.width - MARGIN

        def newline() -> None:
            nonlocal cx, line_top, line_h
            if line_h:
                line_top += line_h
            cx, line_h = x, 0.0

        for c in el.children:
            if isinstance(c, str):
                words = c.split()
                if not words:
                    if c and cx > x:
                        cx += text_width(" ")
                    continue
                if c[:1].isspace() and cx > x:
                    cx += text_width(" ")
                size = H1_SIZE if el.tag == "h1" else FONT_SIZE
                for i, word in enumerate(words):
                    w = text_width(word, size, el.tag == "h1")
                    if cx > x and cx + w > right:
                        newline()
                    self.runs.append((cx, line_top, word, el))
                    cx += w + (text_width(" ", size) if i < len(words) - 1 else 0.0)
                    line_h = max(line_h, size * 1.4)
                if c[-1:].isspace():
                    cx += text_width(" ")
                continue
            if c.tag in SKIP or c.input_type == "hidden":
                continue
            if c.tag in BLOCK:
                newline()
                first = el.tag == "body" and line_top == y  # collapses with the body's margin
                top = line_top + (0.0 if first else _margin(c))
                indent = 40.0 if c.tag in ("ul", "ol") else 0.0
                bottom = self.block(c, x + indent, top)
                c.box = (x + indent, top, right - x - indent, bottom - top)
                line_top, cx, line_h = bottom + _margin(c, below=True), x, 0.0
                continue
            w, h = _inline_size(c)
            if cx > x and cx + w > right:
                newline()
            c.box = (cx, line_top + 3, w, h)
            if c.tag == "a":  # a link lays out its text itself, on one line
                self.runs.append((cx, line_top, c.text(), c))
            cx += w + 4
            line_h = max(line_h, h + 6)
        newline()
        return line_top


def _margin(el: El, below: bool = False) -> float:
    if el.tag == "h1":
        return 21.0
    if el.tag in ("p", "ul", "ol"):
        return 16.0
    if el.tag == "label" and not below:
        return 8.0
    return 0.0


def _inline_size(el: El) -> tuple[float, float]:
    if el.tag == "a":
        return text_width(el.text()), float(LINE)
    if el.tag == "select":
        longest = max((text_width(o.text()) for o in el.options), default=40.0)
        return longest + 34, float(FIELD_H)
    if el.tag == "button" or el.input_type in ("submit", "button", "reset"):
        label = el.text() if el.tag == "button" else el.value
        return text_width(label) + 16, float(FIELD_H + 2)
    if el.input_type in ("checkbox", "radio"):
        return float(CHECK), float(CHECK)
    if el.tag in ("input", "textarea"):
        return float(FIELD_W), float(FIELD_H)
    return text_width(el.text()), float(LINE)
