"""The browser reaches only the task's own site: each way out is blocked and counted.

A real HTTP server on loopback stands for "elsewhere"; every hostile page points at it, and
each test checks that the page's attempt was counted by kind and that the server got nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs.gui.actions import Action
from envs.gui.session import BrowserPool, SessionConfig
from envs.gui.tasks import Response
from envs.gui.tree import find
from tests.gui.sites import PagesSite, html

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("chromium")]


class Outside:
    """A loopback HTTP server counting the requests that reach it."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"outside")

            def log_message(self, *args: object) -> None:
                pass

        self.hits = hits
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def outside() -> Iterator[Outside]:
    o = Outside()
    yield o
    o.server.shutdown()


async def visit(
    site: PagesSite, *, click: str | None = None, wait_s: float = 0.4
) -> dict[str, int]:
    """Open the site, optionally click a link by name, wait a moment; what was blocked."""
    pool = BrowserPool.shared()
    session, error = await pool.open(
        site, SessionConfig(action_timeout_s=1.0, page_load_timeout_s=2.0)
    )
    try:
        assert error is None, error
        if click is not None:
            view = await pool.call(session.observe())
            node = find(view.nodes, "link", click) or find(view.nodes, "button", click)
            assert node is not None, view.tree
            await pool.call(session.act(Action(kind="click", element=node.id)))
        await pool.call(session.page.wait_for_timeout(wait_s * 1000))
        return dict(session.blocked)
    finally:
        await pool.release(session)


def hostile(body: str, **pages: Response) -> PagesSite:
    return PagesSite({"/": html(body), **{"/" + k: v for k, v in pages.items()}})


async def check(outside: Outside, site: PagesSite, kind: str, **kw: object) -> None:
    before = len(outside.hits)
    blocked = await visit(site, **kw)  # type: ignore[arg-type]
    assert blocked.get(kind, 0) >= 1, blocked
    assert "escaped" not in blocked, blocked
    assert len(outside.hits) == before, outside.hits  # nothing reached the outside server


async def test_fetch(outside: Outside) -> None:
    await check(
        outside, hostile(f"<script>fetch('{outside.url}/f').catch(() => 0)</script>"), "fetch"
    )


async def test_xhr(outside: Outside) -> None:
    js = f"const x = new XMLHttpRequest(); x.open('GET', '{outside.url}/x'); x.send();"
    await check(outside, hostile(f"<script>{js}</script>"), "xhr")


async def test_websocket(outside: Outside) -> None:
    ws = outside.url.replace("http:", "ws:")
    await check(outside, hostile(f"<script>new WebSocket('{ws}/ws')</script>"), "websocket")


async def test_img_src(outside: Outside) -> None:
    await check(outside, hostile(f"<img src='{outside.url}/i.png' alt='x'>"), "img")


async def test_script_src(outside: Outside) -> None:
    await check(outside, hostile(f"<script src='{outside.url}/s.js'></script>"), "script")


async def test_iframe(outside: Outside) -> None:
    await check(outside, hostile(f"<iframe src='{outside.url}/frame'></iframe>"), "iframe")


async def test_http_redirect_off_the_site(outside: Outside) -> None:
    away = Response(body="", status=302, headers={"Location": f"{outside.url}/r"})
    site = hostile("<a href='/go'>go</a>", go=away)
    await check(outside, site, "redirect", click="go")


async def test_script_and_link_navigation_off_the_site(outside: Outside) -> None:
    await check(
        outside, hostile(f"<script>location.href = '{outside.url}/nav'</script>"), "navigation"
    )
    await check(outside, hostile(f"<a href='{outside.url}/a'>away</a>"), "navigation", click="away")
    await check(
        outside,
        hostile(f"<a href='{outside.url}/p' target='_blank'>tab</a>"),
        "navigation",
        click="tab",
    )


async def test_file_urls(outside: Outside, tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "secret.html"
    secret.write_text("<p>secret</p>")
    site = hostile(
        f"<iframe src='file://{secret}'></iframe><img src='file:///etc/hostname' alt='f'>"
    )
    await check(outside, site, "file")
    pool = BrowserPool.shared()  # and a page cannot be navigated there either
    session, _ = await pool.open(hostile(f"<a href='file://{secret}'>local</a>"), SessionConfig())
    try:
        view = await pool.call(session.observe())
        node = find(view.nodes, "link", "local")
        assert node is not None
        await pool.call(session.act(Action(kind="click", element=node.id)))
        await pool.call(session.page.wait_for_timeout(300))
        after = await pool.call(session.observe())
        assert after.url.startswith("http://task.agentrl/") and "secret" not in after.tree
    finally:
        await pool.release(session)


async def test_downloads(outside: Outside) -> None:
    attachment = Response(
        body=b"data",
        content_type="application/octet-stream",
        headers={"Content-Disposition": "attachment; filename=x.bin"},
    )
    site = hostile("<a href='/file'>get</a>", file=attachment)
    await check(outside, site, "download", click="get", wait_s=0.8)


async def test_service_workers(outside: Outside) -> None:
    js = "navigator.serviceWorker && navigator.serviceWorker.register('/sw.js').catch(() => 0)"
    site = hostile(
        f"<script>{js}</script>", **{"sw.js": Response(body="", content_type="text/javascript")}
    )
    await check(outside, site, "service_worker")
    assert not any(r.path == "/sw.js" for r in site.requests)
