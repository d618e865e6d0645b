"""A browser without a browser: our task sites parsed, laid out and drawn with Pillow.

    pool = DrawnPool()                                   # the ``BrowserPool`` interface
    session, error = await pool.open(site, SessionConfig())
    view = await pool.work(session.observe())            # PNG, element tree, URL, title
    error = await pool.work(session.act(action))         # None, or what went wrong

``gui/Browser-v0`` with ``backend="pillow"`` uses this instead of Chromium, for machines
where Chromium cannot run (the GPU host has no package registry to install it from). It
serves the same sites (``envs/gui/tasks.py``), gives the same observation and action types,
and builds the element tree the way ``snapshot.js`` does, so for our five task types the
tree text (roles, names, values, states and ids) equals Chromium's (``tests/gui``, browser
marker, checks this step by step along the oracle plans). What differs is the picture: a
simple block-and-line layout drawn with one font, not Chromium's rendering, so a model
trained on these screenshots has not seen Chromium's.

What it supports is what the sites use: headings, paragraphs, lists, links, forms with
text, password, search, checkbox and hidden inputs, selects and buttons, labels (``for=`` or
wrapping), ``role``/``aria-label`` attributes. It runs no script and loads nothing but the
site's own pages, so MiniWoB tasks (pages driven by JavaScript) need Chromium. A link or a
redirect off the site is refused and counted in ``blocked``, as Chromium's session does.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from PIL import Image, ImageDraw, ImageFont

from agentrl.errors import EnvError
from envs.gui.actions import Action
from envs.gui.tasks import ORIGIN, Request, Response, Site
from envs.gui.tree import prune
from envs.gui.view import PageView, SessionConfig

T = TypeVar("T")

VOID = frozenset({"input", "br", "meta", "link", "img", "hr"})
SKIP = frozenset({"script", "style", "noscript", "template", "head", "meta", "link", "title"})
TAGS = {
    "a": "link",
    "button": "button",
    "select": "combobox",
    "textarea": "textbox",
    **{f"h{i}": "heading" for i in range(1, 7)},
    "img": "img",
    "ul": "list",
    "ol": "list",
    "li": "listitem",
    "form": "form",
    "nav": "navigation",
    "main": "main",
    "table": "table",
    "tr": "row",
    "td": "cell",
    "th": "columnheader",
    "p": "paragraph",
    "option": "option",
    "label": "label",
    "dialog": "dialog",
}
INPUTS = {
    "checkbox": "checkbox",
    "radio": "radio",
    "button": "button",
    "submit": "button",
    "reset": "button",
    "image": "button",
    "search": "searchbox",
    "range": "slider",
    "number": "spinbutton",
}
NAMED_BY_TEXT = frozenset(
    {"link", "button", "heading", "option", "columnheader", "menuitem", "tab", "clickable"}
)
BLOCK = frozenset(
    {"p", "ul", "ol", "li", "form", "nav", "main", "div", "label", "table", "tr", "dialog"}
    | {f"h{i}" for i in range(1, 7)}
)
TEXT_FIELDS = frozenset({"text", "password", "search", "email", "url", "tel", "number"})
KEYS = frozenset(
    {"Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Home", "End", "PageUp"}
    | {"PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"}
)
FONT_SIZE, H1_SIZE, LINE = 16, 32, 22
MARGIN = 24  # body margin, CSS pixels (tasks.STYLE)
FIELD_W, FIELD_H, CHECK = 180, 26, 13
INK, LINK, ERROR, EDGE, FOCUS = "#111111", "#0000ee", "#bb0000", "#767676", "#1a73e8"


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


class _Layout:
    """A block-and-line flow: blocks stack, inline boxes (text, links, controls) fill lines."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.runs: list[tuple[float, float, str, El]] = []  # x, y, text, owner (drawn later)

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


# --- the session ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Page:
    url: str
    title: str
    body: El
    height: float = 0.0
    scroll: float = 0.0
    ids: dict[int, El] = field(default_factory=dict)  # id -> element, as snapshot.js hands out
    id_of: dict[El, int] = field(default_factory=dict)
    focus: El | None = None


class DrawnSession:
    """One task site in a drawn page; the ``Session`` interface of ``envs/gui/session.py``."""

    def __init__(self, site: Site, config: SessionConfig) -> None:
        self.site = site
        self.config = config
        self.blocked: Counter[str] = Counter()
        self.dialogs: list[str] = []
        self.page: _Page | None = None
        self.history: list[_Page] = []

    # the requests a page makes -------------------------------------------------------------
    async def start(self) -> str | None:
        error = await self._load(Request(method="GET", path=self.site.start_path))
        if error is None:
            error = await self.page_hook(self.site.on_start)
        return error

    async def _load(self, request: Request, *, redirects: int = 5) -> str | None:
        """Fetch a page from the site and show it; an error text when that fails."""
        try:
            resp = self.site.respond(request)
        except Exception as e:  # a bug in a task's server is an error page, not a crash
            resp = Response(body=f"task site error: {type(e).__name__}", status=500)
        if resp.delay_s > 0:
            limit = float(self.config.page_load_timeout_s)
            await asyncio.sleep(min(resp.delay_s, limit))
            if resp.delay_s > limit:
                return f"page load timed out after {limit:g} s"
        location = resp.headers.get("Location", "")
        if 300 <= resp.status < 400 and location:
            target = _on_site(location)
            if target is None:
                self.blocked["redirect"] += 1
                resp = Response(body="redirect off the task site blocked", status=403)
            elif redirects > 0:
                return await self._load(_get(target), redirects=redirects - 1)
        body = resp.body if isinstance(resp.body, str) else resp.body.decode("utf-8", "replace")
        if not resp.content_type.startswith("text/html"):
            body = f"<pre>{body}</pre>"
        root, title = parse(body)
        url = ORIGIN + request.path
        if request.method == "GET" and request.query:
            url += "?" + urlencode(request.query)
        if self.page is not None:
            self.history.append(self.page)
        self.page = _Page(url=url, title=title or url.removeprefix("http://"), body=root)
        self._layout()
        return None

    async def page_hook(
        self, hook: Callable[[Callable[[str], Awaitable[Any]]], Awaitable[None]]
    ) -> str | None:
        """Run a site's page hook; this backend runs no page code, so a hook that asks fails."""

        async def evaluate(js: str) -> Any:
            raise EnvError(
                "the pillow backend runs no page code; use backend='chromium' for this task"
            )

        try:
            await hook(evaluate)
        except EnvError as e:
            return str(e)
        return None

    # what the agent sees -------------------------------------------------------------------
    def _layout(self) -> None:
        assert self.page is not None
        lay = _Layout(int(self.config.viewport[0]))
        bottom = lay.block(self.page.body, MARGIN, MARGIN)
        self.page.body.box = (0.0, 0.0, float(self.config.viewport[0]), bottom + MARGIN)
        self.page.height = bottom + MARGIN
        self._runs = lay.runs

    def snapshot(self) -> dict[str, Any]:
        """The raw tree ``snapshot.js`` would return for this page (``tree.prune`` reads it)."""
        page = self.page
        assert page is not None

        def id_of(el: El) -> int:
            if el not in page.id_of:
                page.id_of[el] = n = len(page.ids) + 1
                page.ids[n] = el
            return page.id_of[el]

        def walk(el: El) -> dict[str, Any]:
            role = _role(el)
            node: dict[str, Any] = {"role": role, "children": []}
            if role == "label" and self._control(el) is not None:
                node["labels"] = True
            if role:
                x, y, w, h = el.box
                node |= {
                    "id": id_of(el),
                    "name": self._name(el, role),
                    "box": [x, y - page.scroll, w, h],
                }
                if w == 0 and h == 0 and role != "option":
                    node["hidden"] = True
                if el.tag in ("input", "textarea"):
                    if role in ("checkbox", "radio"):
                        node["checked"] = el.checked
                    elif role != "button":
                        node["value"] = el.value
                node["focused"] = page.focus is el
                if el.tag == "select":
                    opts = el.options
                    node["value"] = opts[el.selected].text() if opts else ""
                    return node | {"disabled": "disabled" in el.attrs}
                node["disabled"] = "disabled" in el.attrs
            for c in el.children:
                if isinstance(c, str):
                    if c.strip():
                        node["children"].append({"role": "text", "name": c.strip(), "children": []})
                elif c.tag not in SKIP:
                    node["children"].append(walk(c))
            return node

        return walk(page.body)

    def _name(self, el: El, role: str) -> str:
        if el.get("aria-label"):
            return el.get("aria-label")
        labels = self._labels(el)
        if labels:
            return " ".join(lb.text() for lb in labels)
        if el.get("alt"):
            return el.get("alt")
        if role == "button" and el.tag == "input":
            return el.value
        if role in NAMED_BY_TEXT:
            return el.text()
        return el.get("title") or el.get("placeholder")

    def _labels(self, el: El) -> list[El]:
        if el.tag not in ("input", "select", "textarea", "button") or el.input_type == "hidden":
            return []
        assert self.page is not None
        return [lb for lb in self.page.body.walk() if lb.tag == "label" and self._control(lb) is el]

    def _control(self, label: El) -> El | None:
        """The control a ``<label>`` names: its ``for=`` target, else the first inside it."""
        assert self.page is not None
        target = label.get("for")
        if target:
            return next((e for e in self.page.body.walk() if e.get("id") == target), None)
        return next(
            (
                e
                for e in label.walk()[1:]
                if e.tag in ("input", "select", "textarea", "button") and e.input_type != "hidden"
            ),
            None,
        )

    async def observe(self, screenshot: bool = True) -> PageView:
        """Screenshot (``b""`` when not asked for), pruned element tree, URL and title."""
        page = self.page
        assert page is not None
        nodes = prune(self.snapshot())
        png = await asyncio.to_thread(self.draw) if screenshot else b""
        return PageView(url=page.url, title=page.title, nodes=nodes, png=png)

    def draw(self) -> bytes:
        """The viewport as a PNG, ``viewport * device_scale`` pixels."""
        page = self.page
        assert page is not None
        s = float(self.config.device_scale)
        vw, vh = self.config.viewport
        img = Image.new("RGB", (round(vw * s), round(vh * s)), "white")
        d = ImageDraw.Draw(img)

        def rect(box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
            x, y, w, h = box
            y -= page.scroll
            return (x * s, y * s, (x + w) * s, (y + h) * s)

        for x, y, word, owner in self._runs:
            heading = owner.tag == "h1"
            color = LINK if owner.tag == "a" else ERROR if owner.get("role") == "alert" else INK
            f = font(round((H1_SIZE if heading else FONT_SIZE) * s), heading)
            d.text((x * s, (y - page.scroll) * s), word, fill=color, font=f)
            if owner.tag == "a":
                w = text_width(word)
                base = (y - page.scroll + FONT_SIZE * 1.15) * s
                d.line((x * s, base, (x + w) * s, base), fill=LINK, width=max(1, round(s)))
        f = font(round(FONT_SIZE * s))
        for el in page.body.walk():
            x0, y0, x1, y1 = rect(el.box)
            if el.tag == "li":
                d.text((x0 - 16 * s, y0), "•", fill=INK, font=f)
            if el.tag == "select":
                opts = el.options
                d.rectangle((x0, y0, x1, y1), outline=EDGE, fill="white")
                label = opts[el.selected].text() if opts else ""
                d.text((x0 + 6 * s, y0 + 3 * s), label, fill=INK, font=f)
                d.polygon(
                    [
                        (x1 - 18 * s, y0 + 10 * s),
                        (x1 - 8 * s, y0 + 10 * s),
                        (x1 - 13 * s, y0 + 16 * s),
                    ],
                    fill=INK,
                )
            elif el.tag == "button" or el.input_type in ("submit", "button", "reset"):
                d.rectangle((x0, y0, x1, y1), outline=EDGE, fill="#efefef")
                label = el.text() if el.tag == "button" else el.value
                d.text((x0 + 8 * s, y0 + 4 * s), label, fill=INK, font=f)
            elif el.input_type in ("checkbox", "radio"):
                d.rectangle((x0, y0, x1, y1), outline=EDGE, fill="white")
                if el.checked:
                    d.line(
                        (x0 + 2 * s, (y0 + y1) / 2, (x0 + x1) / 2, y1 - 2 * s), fill=INK, width=2
                    )
                    d.line(((x0 + x1) / 2, y1 - 2 * s, x1 - 2 * s, y0 + 2 * s), fill=INK, width=2)
            elif el.tag in ("input", "textarea") and el.input_type != "hidden":
                d.rectangle((x0, y0, x1, y1), outline=EDGE, fill="white")
                shown = "•" * len(el.value) if el.input_type == "password" else el.value
                d.text((x0 + 4 * s, y0 + 3 * s), shown, fill=INK, font=f)
            if el is page.focus and el.tag != "body":
                d.rectangle(
                    (x0 - 2 * s, y0 - 2 * s, x1 + 2 * s, y1 + 2 * s), outline=FOCUS, width=2
                )
        out = io.BytesIO()
        img.save(out, format="PNG")
        return out.getvalue()

    # actions -------------------------------------------------------------------------------
    async def act(self, action: Action) -> str | None:
        """Do one action; None when it worked, else what went wrong (for the agent to read)."""
        page = self.page
        assert page is not None
        c = self.config
        if action.kind == "back":
            if not self.history:
                return "back(): there is no earlier page"
            self.page = self.history.pop()
            self._layout()
            return None
        if action.kind == "scroll":
            step = c.viewport[1] * 0.8 * (1 if action.text == "down" else -1)
            page.scroll = min(max(0.0, page.scroll + step), max(0.0, page.height - c.viewport[1]))
            return None
        if action.kind == "press":
            return await self._press(action)
        if action.kind == "click" and action.element is None:
            assert action.x is not None and action.y is not None
            w, h = (v * c.device_scale for v in c.viewport)
            if not (0 <= action.x < w and 0 <= action.y < h):
                return f"{action}: outside the screenshot ({w:g} x {h:g} pixels)"
            return await self._click_at(
                action.x / c.device_scale, action.y / c.device_scale + page.scroll
            )
        assert action.element is not None
        el = page.ids.get(action.element)
        if el is None:
            return f"{action}: there is no element [{action.element}] on this page"
        if "disabled" in el.attrs:
            return f"{action} timed out after {c.action_timeout_s:g} s (is the element visible and enabled?)"
        if action.kind == "click":
            x, y, w, h = el.box
            return await self._click_at(x + w / 2, y + h / 2, fallback=el)
        if action.kind == "type":
            if not (el.tag == "textarea" or el.input_type in TEXT_FIELDS):
                return f"{action} failed: element [{action.element}] is not a text field"
            el.value, page.focus = action.text, el
            return None
        if el.tag != "select":
            return f"{action}: element [{action.element}] is not a drop-down (select)"
        opts = el.options
        match = [i for i, o in enumerate(opts) if action.text in (o.text(), el.option_value(o))]
        if not match:
            names = ", ".join(repr(o.text()) for o in opts)
            return f"{action}: no option {action.text!r}; the options are {names}"
        el.selected = match[0]  # Chromium moves no focus here either
        return None

    def _hit(self, x: float, y: float) -> El | None:
        """The innermost element drawn at (x, y) in page pixels."""
        assert self.page is not None
        hit = None
        for el in self.page.body.walk()[1:]:
            bx, by, bw, bh = el.box
            if bw and bh and bx <= x < bx + bw and by <= y < by + bh:
                hit = el  # document order: a later (inner) element wins
        return hit

    async def _click_at(self, x: float, y: float, fallback: El | None = None) -> str | None:
        page = self.page
        assert page is not None
        el = self._hit(x, y) or fallback
        while el is not None:  # the nearest element with something to do
            if el.tag == "a" and el.get("href"):
                target = _on_site(el.get("href"))
                if target is None:
                    self.blocked["navigation"] += 1
                    return None
                return await self._load(_get(target))
            if el.tag == "label":
                control = self._control(el)
                if control is not None:
                    el = control
                    continue
            if el.input_type in ("checkbox", "radio"):
                el.checked = True if el.input_type == "radio" else not el.checked
                page.focus = el
                return None
            if el.tag in ("input", "select", "textarea"):
                page.focus = el
                if el.input_type not in ("submit", "image"):
                    return None
            if el.tag == "button" or el.input_type in ("submit", "image"):
                page.focus = el
                form = el.ancestor("form")
                if form is not None and el.get("type", "submit").lower() == "submit":
                    return await self._submit(form)
                return None
            el = el.parent
        page.focus = None
        return None

    async def _press(self, action: Action) -> str | None:
        page = self.page
        assert page is not None
        key = action.text
        if key not in KEYS and len(key) != 1:
            return f'{action} failed: Unknown key: "{key}"'
        focus = page.focus
        if key == "Tab":
            order = [e for e in page.body.walk() if _focusable(e)]
            if order:
                i = order.index(focus) + 1 if focus in order else 0
                page.focus = order[i % len(order)]
            return None
        if focus is None or not (focus.tag == "textarea" or focus.input_type in TEXT_FIELDS):
            return None
        if key == "Enter":
            form = focus.ancestor("form")
            return await self._submit(form) if form is not None else None
        if key == "Backspace":
            focus.value = focus.value[:-1]
        elif len(key) == 1:
            focus.value += key
        return None

    async def _submit(self, form: El) -> str | None:
        fields: list[tuple[str, str]] = []
        for el in form.walk():
            name = el.get("name")
            if not name or "disabled" in el.attrs:
                continue
            if el.tag == "select" and el.options:
                fields.append((name, el.option_value(el.options[el.selected])))
            elif el.input_type in ("checkbox", "radio"):
                if el.checked:
                    fields.append((name, el.get("value", "on")))
            elif el.tag == "textarea" or (
                el.tag == "input" and el.input_type in TEXT_FIELDS | {"hidden"}
            ):
                fields.append((name, el.value))
        target = _on_site(form.get("action") or "/")
        if target is None:
            self.blocked["navigation"] += 1
            return None
        path, _ = target
        if form.get("method", "get").lower() == "post":
            return await self._load(Request(method="POST", path=path, form=dict(fields)))
        return await self._load(Request(method="GET", path=path, query=dict(fields)))

    async def close(self) -> None:
        self.page, self.history = None, []


def _role(el: El) -> str:
    if el.get("role"):
        return el.get("role")
    if el.tag == "input":
        t = el.input_type
        return "" if t == "hidden" else INPUTS.get(t, "textbox")
    if el.tag == "a" and "href" not in el.attrs:
        return ""
    return TAGS.get(el.tag, "")


def _focusable(el: El) -> bool:
    if "disabled" in el.attrs or el.input_type == "hidden":
        return False
    return el.tag in ("input", "select", "textarea", "button") or (
        el.tag == "a" and "href" in el.attrs
    )


def _on_site(url: str) -> tuple[str, dict[str, str]] | None:
    """The path and query of a link on the task site; None for anywhere else."""
    if url.startswith(ORIGIN):
        url = url.removeprefix(ORIGIN) or "/"
    if not url.startswith("/") or url.startswith("//"):
        return None
    parts = urlsplit(url)
    return parts.path or "/", dict(parse_qsl(parts.query))


def _get(target: tuple[str, dict[str, str]]) -> Request:
    return Request(method="GET", path=target[0], query=target[1])


class DrawnPool:
    """The ``BrowserPool`` interface for drawn pages: no process, no thread, no cap to wait on."""

    def __init__(self) -> None:
        self.open_sessions = 0

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    async def work(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    async def open(self, site: Site, config: SessionConfig) -> tuple[DrawnSession, str | None]:
        session = DrawnSession(site, config)
        self.open_sessions += 1
        return session, await session.start()

    async def release(self, session: DrawnSession) -> None:
        await session.close()
        self.open_sessions -= 1
