"""One Chromium process per Python process, many isolated browser contexts, one per episode.

    pool = BrowserPool.shared()                          # started on first use, capped
    session = await pool.open(site, SessionConfig())     # a fresh context + page on the site
    view = await pool.work(session.observe())            # screenshot, element tree, URL, title
    result = await pool.work(session.act(action))        # error text or None
    await pool.release(session)

Playwright's async objects belong to the event loop that made them, while an ``Env`` is
called from any loop (the sync ``reset``/``step`` wrappers each run one of their own). So the
pool runs Playwright and the browser on a thread of its own with its own loop, and every
browser call is a coroutine handed to that loop (``pool.call``); a semaphore on it caps the
open contexts (``max_contexts``), another the pages working at once (``max_busy``: loads,
actions and observations queue on a busy machine instead of running into their timeouts).
The browser is Debian's chromium with its sandbox on (``agentrl/browser.py``), started with
DNS resolution off and a dead proxy, so a request that escapes Playwright's routing still
goes nowhere.

Isolation (``Guard``): the page reaches only the task's site, served at ``tasks.ORIGIN`` by
answering Playwright's request routing from ``Site.respond`` (no socket). Everything else is
blocked and counted by kind in ``session.blocked``:

    fetch, xhr, img, script, iframe, stylesheet, font, media, other   routed requests elsewhere
    navigation   the main frame sent elsewhere (a link, a script, a meta refresh)
    redirect     an HTTP redirect leaving the site (answered 403 instead)
    websocket    any WebSocket (routed and closed)
    file         a file:// load (Chromium refuses it from the site's origin; seen on the console)
    download     a download (contexts do not accept downloads)
    service_worker  a service worker registration (contexts block them and the task origin is
                 not a secure context; ``register`` is replaced by one that refuses)
    popup        a new window or tab (closed at once)
    escaped      a request that routing did not answer (it fails: no DNS, a dead proxy)
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout
from playwright.async_api import async_playwright

from agentrl.browser import chromium_executable
from agentrl.errors import ConfigError
from envs.gui.actions import Action
from envs.gui.tasks import ORIGIN, Request, Site
from envs.gui.tree import prune
from envs.gui.view import PageView, SessionConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_JS = resources.files("envs.gui").joinpath("snapshot.js").read_text()
CHROMIUM_ARGS = (
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing leaves by accident
    "--font-render-hinting=none",  # the same glyphs on every machine with the same fonts
    "--force-color-profile=srgb",
    "--disable-lcd-text",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
# Pages may not register service workers (the context blocks them too); the attempt is counted.
_BLOCK_SW_JS = """
(() => {
  const refuse = (...a) => {
    try { window.__agentrlBlocked('service_worker'); } catch (e) {}
    return Promise.reject(new DOMException('service workers are blocked', 'SecurityError'));
  };
  if ('serviceWorker' in navigator) {
    Object.defineProperty(navigator.serviceWorker, 'register', { value: refuse });
  } else {  // the task origin is not a secure context: offer a register that refuses and counts
    Object.defineProperty(navigator, 'serviceWorker', { value: { register: refuse } });
  }
})();
"""
_RESOURCE_KINDS = {
    "fetch": "fetch",
    "xhr": "xhr",
    "image": "img",
    "script": "script",
    "stylesheet": "stylesheet",
    "font": "font",
    "media": "media",
}


class Session:
    """One browser context and page showing one task site; runs on the pool's loop."""

    def __init__(self, site: Site, config: SessionConfig) -> None:
        self.site = site
        self.config = config
        self.blocked: Counter[str] = Counter()
        self.dialogs: list[str] = []
        self.context: Any = None
        self.page: Any = None

    async def start(self, browser: Any) -> str | None:
        """Open the context and load the site's start page; an error text when it fails."""
        c = self.config
        self.context = await browser.new_context(
            viewport={"width": c.viewport[0], "height": c.viewport[1]},
            device_scale_factor=c.device_scale,
            service_workers="block",
            accept_downloads=False,
            locale="en-US",
            timezone_id="UTC",
            color_scheme="light",
            reduced_motion="reduce",
        )
        self.context.set_default_timeout(c.action_timeout_s * 1000)
        self.context.set_default_navigation_timeout(c.page_load_timeout_s * 1000)
        await self.context.expose_binding(
            "__agentrlBlocked", lambda _src, kind: self._block(str(kind))
        )
        await self.context.add_init_script(_BLOCK_SW_JS)
        await self.context.route("**/*", self._route)
        await self.context.route_web_socket("**", self._websocket)
        self.context.on("requestfinished", self._finished)
        self.context.on("requestfailed", self._failed)
        self.context.on("page", self._popup)
        self.page = await self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("download", lambda d: self._block("download"))
        self.page.on("dialog", self._dialog)
        error = await self._navigate(self.page.goto(ORIGIN + self.site.start_path))
        if error is None:
            error = await self.page_hook(self.site.on_start)
        return error

    async def page_hook(
        self, hook: Callable[[Callable[[str], Awaitable[Any]]], Awaitable[None]]
    ) -> str | None:
        """Run a site's page hook (``on_start``/``on_step``) with this page's ``evaluate``."""
        try:
            await hook(self.page.evaluate)
        except PlaywrightError as e:
            return f"the task page failed: {_first_line(e)}"
        return None

    def _block(self, kind: str) -> None:
        self.blocked[kind] += 1
        logger.debug("gui: blocked %s", kind)

    async def _route(self, route: Any) -> None:
        request = route.request
        url: str = request.url
        if not (url == ORIGIN or url.startswith(ORIGIN + "/")):
            if request.is_navigation_request():
                try:
                    top = request.frame.parent_frame is None
                except PlaywrightError:  # a new window's first navigation has no frame yet
                    top = True
                if not top:
                    self._block("iframe")
                else:
                    self._block("redirect" if request.redirected_from is not None else "navigation")
            else:
                self._block(_RESOURCE_KINDS.get(request.resource_type, "other"))
            await route.abort("blockedbyclient")
            return
        parts = urlsplit(url)
        form: dict[str, str] = {}
        if request.method == "POST" and request.post_data:
            form = dict(parse_qsl(request.post_data, keep_blank_values=True))
        req = Request(
            method=request.method,
            path=parts.path or "/",
            query=dict(parse_qsl(parts.query)),
            form=form,
        )
        try:
            resp = self.site.respond(req)
        except Exception as e:  # a bug in a task's server is an error page, not a crash
            logger.exception("gui: the task site failed on %s", url)
            await route.fulfill(
                status=500, body=f"task site error: {type(e).__name__}", content_type="text/plain"
            )
            return
        if resp.delay_s > 0:
            await asyncio.sleep(resp.delay_s)
        location = resp.headers.get("Location", "")
        if (
            300 <= resp.status < 400
            and location
            and not (location.startswith("/") and not location.startswith("//"))
            and not location.startswith(ORIGIN + "/")
        ):
            self._block("redirect")
            await route.fulfill(
                status=403, body="redirect off the task site blocked", content_type="text/plain"
            )
            return
        await route.fulfill(
            status=resp.status, body=resp.body, content_type=resp.content_type, headers=resp.headers
        )

    async def _websocket(self, ws: Any) -> None:
        self._block("websocket")
        await ws.close()

    def _finished(self, request: Any) -> None:
        """A request that got an answer from elsewhere than the site (none should)."""
        url: str = request.url
        if not url.startswith((ORIGIN, "data:", "blob:", "about:")):
            self._block("escaped")

    def _failed(self, request: Any) -> None:
        """A request that failed: ours (blocked by client), or one that routing never saw."""
        url: str = request.url
        if url.startswith((ORIGIN, "data:", "blob:", "about:", "file:")):
            return
        if "ERR_BLOCKED_BY_CLIENT" in (request.failure or ""):
            return  # aborted by _route, already counted
        self._block("redirect" if request.redirected_from is not None else "escaped")

    def _console(self, message: Any) -> None:
        if "Not allowed to load local resource" in message.text:
            self._block("file")

    async def _popup(self, page: Any) -> None:
        if page is not self.page and self.page is not None:
            self._block("popup")
            await page.close()

    async def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        await dialog.dismiss()

    async def _navigate(self, coro: Coroutine[Any, Any, Any]) -> str | None:
        try:
            await coro
        except PlaywrightTimeout:
            return f"page load timed out after {self.config.page_load_timeout_s:g} s"
        except PlaywrightError as e:
            return f"page load failed: {_first_line(e)}"
        return None

    async def observe(self, screenshot: bool = True) -> PageView:
        """Screenshot (``b""`` when not asked for), pruned element tree, URL and title."""
        for attempt in range(4):  # a navigation the action started may land while we read
            try:
                raw = await self.page.evaluate(SNAPSHOT_JS)
                break
            except PlaywrightError as e:
                if attempt == 3 or "context was destroyed" not in str(e):
                    raise
                await self._settle()
        png = b""
        if screenshot:
            png = await self.page.screenshot(
                type="png",
                animations="disabled",
                caret="hide",
                timeout=max(self.config.page_load_timeout_s, 10.0) * 1000,  # slow when busy
            )
        return PageView(url=self.page.url, title=await self.page.title(), nodes=prune(raw), png=png)

    async def element(self, element_id: int) -> Any:
        """The element handle behind an id shown in the tree, or None."""
        handle = await self.page.evaluate_handle(
            "id => window.__agentrlEls && window.__agentrlEls.get(id) || null", element_id
        )
        el = handle.as_element()
        if el is None or not await el.evaluate("e => e.isConnected"):
            return None
        return el

    async def act(self, action: Action) -> str | None:
        """Do one action; None when it worked, else what went wrong (for the agent to read)."""
        try:
            return await self._act(action)
        except PlaywrightTimeout:
            return f"{action} timed out after {self.config.action_timeout_s:g} s (is the element visible and enabled?)"
        except PlaywrightError as e:
            return f"{action} failed: {_first_line(e)}"

    async def _act(self, action: Action) -> str | None:
        page, c = self.page, self.config
        if action.kind == "back":
            before = page.url
            err = await self._navigate(page.go_back(wait_until="load"))
            if err is None and not page.url.startswith(ORIGIN):  # the blank page before the task's
                err = await self._navigate(page.go_forward(wait_until="load"))
                return err or "back(): there is no earlier page"
            return err or (None if page.url != before else "back(): there is no earlier page")
        if action.kind == "press":
            await page.keyboard.press(action.text)
            return await self._settle()
        if action.kind == "scroll":
            dy = c.viewport[1] * 0.8 * (1 if action.text == "down" else -1)
            await page.mouse.move(c.viewport[0] / 2, c.viewport[1] / 2)
            await page.mouse.wheel(0, dy)
            await page.wait_for_function("() => true")  # let the scroll land
            return None
        if action.kind == "click" and action.element is None:
            assert action.x is not None and action.y is not None
            w, h = (v * c.device_scale for v in c.viewport)
            if not (0 <= action.x < w and 0 <= action.y < h):
                return f"{action}: outside the screenshot ({w:g} x {h:g} pixels)"
            await page.mouse.click(action.x / c.device_scale, action.y / c.device_scale)
            return await self._settle()
        assert action.element is not None
        el = await self.element(action.element)
        if el is None:
            return f"{action}: there is no element [{action.element}] on this page"
        if action.kind == "click":
            await el.click()
        elif action.kind == "type":
            await el.fill(action.text)
        elif action.kind == "select":
            options: list[list[str]] = await el.evaluate(
                "e => e.tagName === 'SELECT' ? Array.from(e.options).map(o => [o.text, o.value]) : null"
            )
            if options is None:
                return f"{action}: element [{action.element}] is not a drop-down (select)"
            match = [v for t, v in options if action.text in (t.strip(), v)]
            if not match:
                names = ", ".join(repr(t.strip()) for t, _ in options)
                return f"{action}: no option {action.text!r}; the options are {names}"
            await el.select_option(value=match[0])
        return await self._settle()

    async def _settle(self) -> str | None:
        """Wait for a navigation the action started to load (a timeout becomes an error text)."""
        return await self._navigate(self.page.wait_for_load_state("load"))

    async def close(self) -> None:
        if self.context is not None:
            try:
                await self.context.close()
            except Exception:  # the browser may be gone already
                logger.debug("gui: context close failed", exc_info=True)
            self.context = None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class BrowserPool:
    """The process's one Chromium, on a thread of its own; contexts capped by ``max_contexts``."""

    _shared: BrowserPool | None = None
    _shared_lock = threading.Lock()

    def __init__(self, max_contexts: int = 16, max_busy: int | None = None) -> None:
        if max_contexts < 1:
            raise ConfigError(f"max_contexts must be >= 1, got {max_contexts}")
        self.max_contexts = max_contexts
        # Page work (loads, actions, observations) running at once. Without a cap, 32 sessions
        # on 2 cores timed out: 31 of 32 page loads (page_load_timeout_s=5), then 24 of 32
        # typing actions (action_timeout_s=2). Queued work starts its clock when it starts.
        if max_busy is not None and max_busy < 1:
            raise ConfigError(f"max_busy must be >= 1, got {max_busy}")
        self.max_busy = max_busy or max(2, 2 * (os.cpu_count() or 1))
        self._busy: asyncio.Semaphore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agentrl-browser", daemon=True
        )
        self._thread.start()
        self._browser: Any = None
        self._playwright: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._launch_lock = asyncio.Lock()  # used on the pool's loop only
        self._workdir = Path(tempfile.mkdtemp(prefix="agentrl-chromium-"))
        self.open_sessions = 0

    @classmethod
    def shared(cls, max_contexts: int = 16) -> BrowserPool:
        """The pool of this process (made on first use; closed at exit)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(max_contexts)
                atexit.register(cls._shared.shutdown)
            elif cls._shared.max_contexts != max_contexts:
                logger.warning(
                    "gui: this process's browser pool was made with max_contexts=%d; a "
                    "request for %d is ignored (give every env of the process the same "
                    "max_contexts)",
                    cls._shared.max_contexts,
                    max_contexts,
                )
            return cls._shared

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the browser's loop and await its result from any loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _ensure_browser(self) -> Any:
        async with self._launch_lock:  # concurrent first opens start one browser, not several
            return await self._launch()

    async def _launch(self) -> Any:
        if self._browser is None or not self._browser.is_connected():
            exe = chromium_executable(self._workdir)
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            self._browser = await self._playwright.chromium.launch(
                executable_path=exe,
                chromium_sandbox=True,
                args=list(CHROMIUM_ARGS),
                proxy={"server": "http://127.0.0.1:9"},  # a dead proxy: no request gets out
            )
            self._sem = asyncio.Semaphore(self.max_contexts)
            self._busy = asyncio.Semaphore(self.max_busy)
        return self._browser

    async def _open(self, site: Site, config: SessionConfig) -> tuple[Session, str | None]:
        browser = await self._ensure_browser()
        assert self._sem is not None
        await self._sem.acquire()
        session = Session(site, config)
        self.open_sessions += 1
        try:
            assert self._busy is not None
            async with self._busy:
                error = await session.start(browser)
        except BaseException:
            await self._release(session)
            raise
        return session, error

    async def work(self, coro: Coroutine[Any, Any, T]) -> T:
        """``call`` for page work (an action, an observation, a page hook): it waits while
        ``max_busy`` pages are working, so a busy machine queues work instead of timing it out."""

        async def limited() -> T:
            if self._busy is None:  # no browser yet: nothing to wait for
                return await coro
            async with self._busy:
                return await coro

        return await self.call(limited())

    async def open(self, site: Site, config: SessionConfig) -> tuple[Session, str | None]:
        """A new session on ``site`` (waits while ``max_contexts`` are open) and its load error."""
        return await self.call(self._open(site, config))

    async def _release(self, session: Session) -> None:
        await session.close()
        self.open_sessions -= 1
        if self._sem is not None:
            self._sem.release()

    async def release(self, session: Session) -> None:
        """Close a session's context and free its slot."""
        await self.call(self._release(session))

    def shutdown(self) -> None:
        """Close the browser and stop the thread (at exit for the shared pool)."""

        async def stop() -> None:
            if self._browser is not None:
                await self._browser.close()
            if self._playwright is not None:
                await self._playwright.stop()

        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
            except Exception:
                logger.debug("gui: browser shutdown failed", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
