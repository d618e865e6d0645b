"""A browser without a browser: our task sites parsed, laid out and drawn with Pillow.

    pool = DrawnPool()                                   # the ``BrowserPool`` interface
    session, error = await pool.open(site, SessionConfig())
    view = await pool.work(session.observe())            # PNG, element tree, URL, title
    error = await pool.work(session.act(action))         # None, or what went wrong

``gui/Browser-v0`` with ``backend="pillow"`` uses this instead of Chromium, for machines
where Chromium cannot run (the GPU host has no package registry to install it from). It
serves the same sites (``envs/gui/tasks.py``), gives the same observation and action types,
and builds the element tree the way ``snapshot.js`` does (the document, its parser and its
layout are ``envs/gui/document.py``), so for our five task types the
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
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from PIL import Image, ImageDraw

from agentrl.errors import EnvError
from envs.gui.actions import Action
from envs.gui.document import (
    FONT_SIZE,
    H1_SIZE,
    SKIP,
    El,
    Layout,
    Run,
    font,
    parse,
    text_width,
)
from envs.gui.tasks import ORIGIN, Request, Response, Site
from envs.gui.tree import prune
from envs.gui.view import PageView, SessionConfig

T = TypeVar("T")

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
TEXT_FIELDS = frozenset({"text", "password", "search", "email", "url", "tel", "number"})
KEYS = frozenset(
    {"Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Home", "End", "PageUp"}
    | {"PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"}
)
INK, LINK, ERROR, EDGE, FOCUS = "#111111", "#0000ee", "#bb0000", "#767676", "#1a73e8"


# --- the session ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Page:
    url: str
    title: str
    body: El
    height: float = 0.0
    scroll: float = 0.0
    runs: list[Run] = field(default_factory=list)  # the words to draw (Layout.runs)
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
        layout = Layout(int(self.config.viewport[0]))
        self.page.height = layout.place(self.page.body)
        self.page.runs = layout.runs

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

        for x, y, word, owner in page.runs:
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
