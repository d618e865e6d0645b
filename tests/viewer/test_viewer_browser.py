"""`agentrl view` in real headless Chromium (Playwright driving Debian's chromium).

The viewer serves a run directory built by tests/viewer/runs.py on loopback; the tests load
the page, filter the list, open a tool-calling trajectory and its tokens, check that hostile
text shows literally and runs nothing, and save the screenshot the docs page shows.

Chromium keeps its sandbox on. When the tests run as root (CI containers), chromium would
refuse to start with its sandbox, so it is started as the unprivileged user ``nobody``
through a small wrapper (``setpriv``, in ``agentrl/browser.py``) instead of with ``--no-sandbox``.

    python -m pytest -m browser tests/viewer        # needs `apt-get install chromium` + playwright
    AGENTRL_UPDATE_DOCS=1 python -m pytest -m browser tests/viewer -k screenshot   # docs PNG
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.browser import chromium_executable, chromium_path
from agentrl.errors import ConfigError
from agentrl.http.service import ServerThread
from agentrl.viewer import Source, TrajectoryIndex, create_app
from agentrl.viewer.tokens import find_tokenizer, load_template
from tests.viewer.runs import PAYLOAD, REMOTE_IMAGE, make_run, record, trajectory

pytestmark = pytest.mark.browser

DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "guides" / "img" / "viewer-tokens.png"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if chromium_path() is None:
        pytest.skip("no chromium: scripts/install-sandbox-deps.sh --browser installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no playwright: pip install -e '.[gui]'")
    try:
        exe = chromium_executable(tmp_path_factory.mktemp("chromium"))
    except ConfigError as e:
        pytest.skip(str(e))
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, chromium_sandbox=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run = tmp_path_factory.mktemp("runs") / "demo"
    make_run(run, broken=(1,))
    app = create_app(TrajectoryIndex([Source(run)]), load_template(find_tokenizer(run)))
    with ServerThread(app) as base:
        yield base


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    # The page's Content-Security-Policy is bypassed: Playwright's waits evaluate strings, and
    # the payload test must show that the page itself runs nothing, CSP or not.
    ctx = browser.new_context(viewport={"width": 1200, "height": 800}, bypass_csp=True)
    pg = ctx.new_page()
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    yield pg
    assert not dialogs, f"a dialog opened: {dialogs}"
    ctx.close()


def test_list_loads_filters_and_permalinks(page: Any, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("#list tr.row")
    assert page.locator("#list tr.row").count() == 8
    page.select_option("select[name=env]", "games/Guess-v0")
    page.fill("input[name=step]", "2")
    page.click("form.filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#list tr.row').length === 2")
    assert "env=games%2FGuess-v0" in page.url and "step=2" in page.url
    page.reload()  # the permalink alone restores the view
    page.wait_for_function("document.querySelectorAll('#list tr.row').length === 2")
    assert page.locator("#total").inner_text().startswith("2 matches")
    page.goto(url + "/#/group/" + "demo%3A2%3A1")
    page.wait_for_selector("#group .card")
    assert page.locator("#group .card").count() == 2
    assert "advantage 0.500" in page.locator("#group").inner_text()
    page.goto(url + "/#/plots")
    page.wait_for_selector("#plots svg polyline")
    assert page.locator("#plots .plot").count() == 4  # the four keys the run logged


def test_tool_calls_and_token_marks(page: Any, url: str) -> None:
    page.goto(url + "/#/list?step=1")
    page.wait_for_selector("#list tr.row")
    page.locator("#list tr.row").first.click()
    page.wait_for_selector("#conversation .toolcall")
    conv = page.locator("#conversation")
    assert conv.locator(".msg.role-tool").count() == 1
    assert "calculator" in conv.locator(".toolcall").inner_text()
    assert "12 * 7" in conv.locator(".toolcall").inner_text()
    page.click("text=Tokens")
    page.wait_for_selector(".tokens .tok")
    gen = page.locator(".tok.m1")
    assert gen.count() > 0 and page.locator(".tok.m0").count() > gen.count()
    assert page.locator(".tok.mismatch").count() == 0
    assert "ledger equals a re-render" in page.locator(".banner.ok").inner_text()
    title = gen.first.get_attribute("title")
    assert "mask=1" in title and "version=0" in title and "trainer_lp=" in title
    assert gen.first.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    # the second trajectory of step 1 has one ledger token changed in the tool output
    page.goto(url + "/#/list?step=1")
    page.wait_for_selector("#list tr.row")
    bad = page.locator("#list tr.row").nth(1).get_attribute("data-id")
    page.goto(f"{url}/#/tokens/{bad}")
    page.wait_for_selector(".tok.mismatch")
    assert page.locator(".tok.mismatch").count() == 1
    marked = int(page.locator(".tok.mismatch").get_attribute("data-i"))
    masks = page.locator(".tokens .tok").evaluate_all(
        "ts => ts.map(t => t.classList.contains('m1'))"
    )
    first_gen = masks.index(True)
    assert marked == masks.index(False, first_gen) + 4
    assert f"at token {marked}" in page.locator(".banner.check").inner_text()


def test_hostile_text_shows_literally_and_runs_nothing(page: Any, url: str) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url + "/")
    page.wait_for_selector("#list tr.row")
    tid = page.locator("#list tr.row").first.get_attribute("data-id")
    for view in ("t", "tokens", "group"):
        target = f"{view}/{tid}" if view != "group" else "group/demo%3A1%3A1"
        page.goto(f"{url}/#/{target}")
        page.wait_for_selector("#main h2")
        page.wait_for_timeout(200)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#main script").count() == 0
        assert page.locator("#main img:not(.shot)").count() == 0
    page.goto(f"{url}/#/t/{tid}")
    page.wait_for_selector("#conversation .msg.role-user")
    assert PAYLOAD in page.locator("#conversation .msg.role-user").inner_text()
    assert PAYLOAD in page.locator("#conversation .msg.role-tool").inner_text()
    assert json.dumps(PAYLOAD) in page.locator("#report").inner_text()  # JSON-quoted
    # screenshots: an inline PNG is shown, a remote URL only named (never fetched)
    assert page.locator("img.shot").count() == 1
    assert page.locator("img.shot").evaluate("i => i.complete && i.naturalWidth") == 1
    assert f"[image: {REMOTE_IMAGE}]" in page.locator("#main").inner_text()
    # the gateway's raw log: one request, bodies shown as text
    log = page.locator("details", has_text="HTTP 200")
    assert log.count() == 1
    log.locator("summary").click()
    assert json.dumps(PAYLOAD) in log.inner_text()
    page.goto(f"{url}/#/tokens/{tid}")
    page.wait_for_selector(".tokens")
    assert "<script>" in page.locator(".tokens").first.inner_text()
    assert page.evaluate("window.__pwned") is None


def test_follows_a_running_run(page: Any, tmp_path: Path) -> None:
    """A step file that training writes while the page is open shows up without a reload."""
    run = tmp_path / "live"
    make_run(run, steps=1)
    with ServerThread(create_app(TrajectoryIndex([Source(run)]))) as base:
        page.goto(base + "/")
        page.wait_for_selector("#list tr.row")
        assert page.locator("#list tr.row").count() == 4
        t = trajectory(answer="84", reward=1.0, env="arith/Calculator-v0", uid="u", version=1)
        line = json.dumps(record(t, step=2, group=0, advantage=0.5)) + "\n"
        tmp = run / "trajectories" / "step_000002.tmp"
        tmp.write_text(line * 2)
        tmp.replace(run / "trajectories" / "step_000002.jsonl")  # as trainers/trajectory_log.py
        page.wait_for_function("document.querySelectorAll('#list tr.row').length === 6")
        assert "6 matches" in page.locator("#total").inner_text()


def test_docs_screenshot(page: Any, url: str, tmp_path: Path) -> None:
    """The picture in docs/guides/viewer.md (rewritten with AGENTRL_UPDATE_DOCS=1)."""
    page.set_viewport_size({"width": 1000, "height": 560})
    page.goto(url + "/#/list?step=1")
    page.wait_for_selector("#list tr.row")
    tid = page.locator("#list tr.row").first.get_attribute("data-id")
    page.goto(f"{url}/#/tokens/{tid}?mode=lp")
    page.wait_for_selector(".tokens .tok.m1")
    out = DOCS_PNG if os.environ.get("AGENTRL_UPDATE_DOCS") == "1" else tmp_path / "viewer.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), type="png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 250_000
