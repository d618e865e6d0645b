"""gui/Browser-v0 in real headless Chromium: checker, observations, actions, failures as values.

python -m pytest -m browser tests/gui      # needs chromium + playwright (the gui extra)
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import os
from pathlib import Path

import pytest

from agentrl.env import make_env
from agentrl.env_checker import check_env
from agentrl.splits import reset_in_split, split_of
from agentrl.types import Message
from envs.gui.env import BrowserEnv, plan_action
from envs.gui.session import BrowserPool, SessionConfig
from envs.gui.tasks import TASKS, TIME_ZONES, CartSite, SettingsSite
from envs.gui.tree import find, walk
from tests.gui.sites import PagesSite, bad_actions, html

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("chromium")]
DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "guides" / "img" / "gui-login.png"


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_passes_the_env_checker() -> None:
    report = check_env("gui/Browser-v0", seeds=(0, 1))
    assert report.passed, str(report)
    assert not any(r.skipped for r in report.results if r.name == "demonstration")


@pytest.mark.parametrize("task", TASKS)
async def test_each_task_is_solved_by_its_plan_and_needs_three_actions(task: str) -> None:
    env = BrowserEnv(task)
    try:
        for seed in (0, 1):
            obs, info = await env.areset(seed=seed)
            assert info["task"] == task and info["error"] is None
            assert obs[0].text.startswith("Task: ") and "URL: http://task.agentrl/" in obs[0].text
            demo = await env.ademonstration()
            assert demo is not None
            actions = [m for m in demo if m.role == "assistant"]
            assert len(actions) >= 3
            for i, m in enumerate(actions):
                _, reward, terminated, truncated, info = await env.astep(m)
                assert info["error"] is None, info
                assert terminated == (i == len(actions) - 1) and not truncated
            assert reward == 1.0 and info["success"] is True
    finally:
        await env.aclose()


async def test_wrong_answers_earn_nothing() -> None:
    env = BrowserEnv("login")
    try:
        await env.areset(seed=4)
        ids = {n.name: n.id for n in walk(env.view.nodes)}
        await env.astep(say(f'type({ids["Username"]}, "{env.site.user}")'))  # type: ignore[union-attr]
        await env.astep(say(f'type({ids["Password"]}, "wrong")'))
        obs, reward, terminated, _, _ = await env.astep(say(f"click({ids['Sign in']})"))
        assert (reward, terminated) == (0.0, False)
        assert "Wrong username or password." in obs[0].text
        env2 = BrowserEnv("form")
        await env2.areset(seed=4)
        node = find(env2.view.nodes, "button", "Send")
        assert node is not None
        _, reward, terminated, _, info = await env2.astep(say(f"click({node.id})"))  # empty form
        assert (reward, terminated, info["success"]) == (0.0, True, False)
        await env2.aclose()
    finally:
        await env.aclose()


async def test_a_wrong_quantity_or_setting_earns_nothing_and_ends_the_episode() -> None:
    """The cart's checker wants exactly the asked quantity of the asked product; the settings'
    checker every asked value: one field off is a failed episode."""
    env = BrowserEnv("cart")
    try:
        await env.areset(seed=3)
        site = env.site
        assert isinstance(site, CartSite)
        wrong = site.quantity % 5 + 1  # another quantity in 1..5
        for step in site.plan:
            text = str(wrong) if step.verb == "select" else step.text
            action = plan_action(dataclasses.replace(step, text=text), env.view.nodes)
            _, reward, terminated, _, info = await env.astep(say(str(action)))
            assert info["error"] is None, info
        assert (reward, terminated, info["success"]) == (0.0, True, False)
        assert site.order == {site.target: wrong}

        env2 = BrowserEnv("settings")
        await env2.areset(seed=3)
        settings = env2.site
        assert isinstance(settings, SettingsSite)
        other = next(z for z in TIME_ZONES if z != settings.time_zone)
        for step in settings.plan:
            text = other if step.name == "Time zone" else step.text
            action = plan_action(dataclasses.replace(step, text=text), env2.view.nodes)
            _, reward, terminated, _, info = await env2.astep(say(str(action)))
        assert (reward, terminated, info["success"]) == (0.0, True, False)
        assert settings.saved is not None and settings.saved["zone"] == other
        await env2.aclose()
    finally:
        await env.aclose()


async def test_content_is_randomised_per_seed_and_splits_by_content() -> None:
    env = BrowserEnv("search")
    keys = set()
    try:
        for seed in range(12):
            obs, info = await env.areset(seed=seed)
            keys.add(env.task_key(obs, info))
    finally:
        await env.aclose()
    assert len(keys) >= 8  # different queries and targets
    assert {split_of(k, 0.3) for k in keys} == {"train", "eval"}


async def test_train_and_eval_tasks_are_disjoint_by_content() -> None:
    env = BrowserEnv()  # every task type
    seen: dict[str, set[str]] = {"train": set(), "eval": set()}
    try:
        for split in ("train", "eval"):
            for seed in range(25):
                obs, info = await reset_in_split(env, seed=seed, split=split, eval_fraction=0.3)  # type: ignore[arg-type]
                key = env.task_key(obs, info)
                assert key == info["task_key"] and split_of(key, 0.3) == split
                assert env.site is not None and env.site.instruction in obs[0].text
                seen[split].add(key)
    finally:
        await env.aclose()
    assert len(seen["train"]) >= 8 and len(seen["eval"]) >= 8
    assert not seen["train"] & seen["eval"]
    assert {k.split(":")[0] for k in seen["eval"]} == set(TASKS)


async def test_same_seed_same_screenshot_and_tree() -> None:
    env = BrowserEnv("form", observe="both")

    async def first_step(seed: int) -> tuple[list[Message], bytes, str]:
        await env.areset(seed=seed)
        assert env.site is not None
        step = plan_action(env.site.plan[0], env.view.nodes)  # types the seed's name
        obs, *_ = await env.astep(say(str(step)))
        return obs, env.view.png, env.view.tree

    try:
        obs_a, png_a, tree_a = await first_step(7)
        obs_b, png_b, tree_b = await first_step(7)
        assert (png_a, tree_a, obs_a) == (png_b, tree_b, obs_b)
        _, png_c, tree_c = await first_step(8)
        assert png_c != png_a and tree_c != tree_a
    finally:
        await env.aclose()
    from PIL import Image

    img = Image.open(io.BytesIO(png_a))
    assert img.size == (800, 600)
    parts = obs_a[0].content
    assert isinstance(parts, list) and parts[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )


GRID = "".join(
    f"<button id='b{i}' style='position:absolute;left:{40 + 90 * (i % 4)}px;top:{30 + 50 * (i // 4)}px;"
    f"width:{60 + i}px;height:{30 + i % 3}px' onclick=\"document.title='hit {i}'\">B{i}</button>"
    for i in range(12)
)


@pytest.mark.parametrize("scale", [1.0, 2.0, 1.5])
async def test_click_by_coordinates_hits_the_element_at_that_pixel(scale: float) -> None:
    pool = BrowserPool.shared()
    site = PagesSite({"/": html(GRID, title="none")})
    session, error = await pool.open(site, SessionConfig(viewport=(420, 260), device_scale=scale))
    try:
        assert error is None
        view = await pool.call(session.observe())
        from PIL import Image

        assert Image.open(io.BytesIO(view.png)).size == (round(420 * scale), round(260 * scale))
        for i in (0, 5, 11):
            node = find(view.nodes, "button", f"B{i}")
            assert node is not None and node.box is not None
            x, y, w, h = node.box
            cx, cy = (x + w / 2) * scale, (y + h / 2) * scale  # screenshot pixels
            from envs.gui.actions import Action

            assert await pool.call(session.act(Action(kind="click", x=cx, y=cy))) is None
            assert (await pool.call(session.observe())).title == f"hit {i}"
    finally:
        await pool.release(session)


async def test_bad_actions_become_observations() -> None:
    env = BrowserEnv("form", max_steps=20, action_timeout_s=0.5)
    try:
        await env.areset(seed=1)
        ids = {n.name: n.id for n in walk(env.view.nodes)}
        cases = bad_actions(ids)
        for reply, says in cases:
            obs, reward, terminated, truncated, info = await env.astep(say(reply))
            assert says in obs[0].text and says in info["error"], (reply, obs[0].text)
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert "Page:\n[1] heading" in obs[0].text  # the page is still shown
    finally:
        await env.aclose()


async def test_steps_run_out_as_truncation() -> None:
    env = BrowserEnv("login", max_steps=2)
    try:
        await env.areset(seed=0)
        assert (await env.astep(say("scroll(down)")))[3] is False
        _, reward, terminated, truncated, info = await env.astep(say("scroll(up)"))
        assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    finally:
        await env.aclose()


async def test_slow_pages_time_out_as_observations() -> None:
    from envs.gui.tasks import Response

    pool = BrowserPool.shared()
    slow = Response(body=html("<p>late</p>").body, delay_s=3.0)
    site = PagesSite({"/": html("<a href='/slow'>go</a>"), "/slow": slow})
    config = SessionConfig(page_load_timeout_s=0.5, action_timeout_s=0.5)
    session, error = await pool.open(site, config)
    try:
        assert error is None
        view = await pool.call(session.observe())
        link = find(view.nodes, "link", "go")
        assert link is not None
        from envs.gui.actions import Action

        err = await pool.call(session.act(Action(kind="click", element=link.id)))
        assert err is not None and "timed out" in err
    finally:
        await pool.release(session)
    site = PagesSite({"/": slow})
    session, error = await pool.open(site, config)  # the start page itself is too slow
    try:
        assert error == "page load timed out after 0.5 s"
    finally:
        await pool.release(session)


async def test_one_browser_many_isolated_contexts_with_a_cap() -> None:
    pool = BrowserPool(max_contexts=2)
    try:
        script = "<script>document.cookie='a=' + (document.cookie ? 'seen' : 'fresh'); localStorage.x = 1;</script>"
        sites = [PagesSite({"/": html(script + "<p>x</p>")}) for _ in range(3)]
        config = SessionConfig()
        (a, _), (b, _) = await asyncio.gather(  # first opens at once: still one browser
            pool.open(sites[0], config), pool.open(sites[1], config)
        )
        assert a.page.context.browser is b.page.context.browser
        third = asyncio.ensure_future(pool.open(sites[2], config))
        await asyncio.sleep(0.5)
        assert not third.done() and pool.open_sessions == 2  # waits for a free slot
        await pool.release(a)
        c, _ = await third
        cookie = await pool.call(c.page.evaluate("document.cookie"))
        assert cookie == "a=fresh"  # nothing shared with the earlier contexts
        assert a.context is None and b.context is not None
        assert b.page.context.browser is c.page.context.browser  # one browser process
        await pool.release(b)
        await pool.release(c)
        assert pool.open_sessions == 0
    finally:
        pool.shutdown()


@pytest.mark.parametrize("max_busy", [1, 3])
async def test_page_work_beyond_max_busy_waits_for_a_free_slot(max_busy: int) -> None:
    pool = BrowserPool(max_contexts=2, max_busy=max_busy)
    running, most = 0, 0

    async def page_work() -> None:  # stands in for an action: counts who runs at once
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1

    try:
        session, _ = await pool.open(PagesSite({"/": html("<p>x</p>")}), SessionConfig())
        await asyncio.gather(*(pool.work(page_work()) for _ in range(6)))
        assert most == max_busy
        await pool.release(session)
    finally:
        pool.shutdown()


@pytest.mark.parametrize("scale", [1.0, 2.0])
async def test_marks_frame_each_element_of_the_tree_in_the_image_the_model_sees(
    scale: float,
) -> None:
    from PIL import Image

    from envs.gui.marks import mark_colour

    env = BrowserEnv("login", observe="both", marks=True, device_scale=scale)
    try:
        obs, _ = await env.areset(seed=0)
        url = obs[0].content[1]["image_url"]["url"]  # type: ignore[index]
        shown = base64.b64decode(url.split(",", 1)[1])
        assert shown == env.image != env.view.png  # the model sees the marked screenshot
        marked = Image.open(io.BytesIO(shown)).convert("RGB")
        plain = Image.open(io.BytesIO(env.view.png)).convert("RGB")
        assert marked.size == plain.size
        framed = [n for n in walk(env.view.nodes) if n.id is not None and n.box is not None]
        assert len(framed) >= 3  # the login form's fields and button at least
        for node in framed:
            assert node.id is not None and node.box is not None
            x, y, w, h = (round(v * scale) for v in node.box)
            edge = (x + w - 1, y + h // 2)  # the right edge of its frame
            assert marked.getpixel(edge) == mark_colour(node.id), node
    finally:
        await env.aclose()


def test_make_env_rejects_bad_options() -> None:
    from agentrl.errors import ConfigError

    bad: tuple[dict[str, object], ...] = (
        {"task": "shop"},
        {"observe": "audio"},
        {"max_steps": 0},
        {"marks": True},  # in text mode there is no image to draw on
    )
    for kwargs in bad:
        with pytest.raises(ConfigError):
            make_env("gui/Browser-v0", **kwargs)  # type: ignore[arg-type]


async def test_docs_screenshot(tmp_path: Path) -> None:
    """The picture in docs/guides/gui.md (rewritten with AGENTRL_UPDATE_DOCS=1): the login
    task after its first action, as observe="both" shows it to a model."""
    env = BrowserEnv("login", observe="both", viewport=(640, 360))
    try:
        await env.areset(seed=0)
        assert env.site is not None
        await env.astep(say(str(plan_action(env.site.plan[0], env.view.nodes))))
        png = env.view.png
    finally:
        await env.aclose()
    out = DOCS_PNG if os.environ.get("AGENTRL_UPDATE_DOCS") == "1" else tmp_path / "gui.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 100_000


async def test_docs_marks_screenshot(tmp_path: Path) -> None:
    """docs/guides/img/gui-form-marks.png (rewritten with AGENTRL_UPDATE_DOCS=1): the form
    task's first page with the set-of-marks overlay, as marks=True shows it to a model."""
    env = BrowserEnv("form", observe="both", marks=True, viewport=(640, 400))
    try:
        await env.areset(seed=0)
        png = env.image
    finally:
        await env.aclose()
    docs = DOCS_PNG.with_name("gui-form-marks.png")
    out = docs if os.environ.get("AGENTRL_UPDATE_DOCS") == "1" else tmp_path / "marks.png"
    out.write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png != env.view.png and len(png) < 100_000
