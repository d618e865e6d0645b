"""gui/Browser-v0 with ``backend="pillow"``: pages drawn without a browser (envs/gui/drawn.py).

The default suite runs these (no Chromium needed); the last test, under the browser marker,
checks that the element tree the model reads is Chromium's, step by step.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
from PIL import Image

from agentrl.env import make_env
from agentrl.errors import ConfigError
from agentrl.types import Message
from envs.gui.actions import Action
from envs.gui.click_tasks import CLICK_TASKS
from envs.gui.drawn import DrawnPool
from envs.gui.env import BrowserEnv, plan_action
from envs.gui.tasks import TASKS, PlanStep, Response
from envs.gui.tree import find, walk
from envs.gui.view import SessionConfig
from tests.gui.sites import PagesSite, bad_actions, html


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


@pytest.mark.parametrize("task", TASKS + CLICK_TASKS)
async def test_each_task_is_solved_by_its_plan(task: str) -> None:
    env = BrowserEnv(task, backend="pillow", observe="both")
    try:
        for seed in (0, 1, 2):
            obs, info = await env.areset(seed=seed)
            assert info["error"] is None and "URL: http://task.agentrl/" in obs[0].text
            demo = await env.ademonstration()
            assert demo is not None
            actions = [m for m in demo if m.role == "assistant"]
            assert len(actions) >= (3 if task in TASKS else 1)
            for i, m in enumerate(actions):
                obs, reward, terminated, truncated, info = await env.astep(m)
                assert info["error"] is None, info
                assert terminated == (i == len(actions) - 1) and not truncated
                assert obs[0].content[1]["image_url"]["url"].startswith("data:image/png;base64,")
            assert reward == 1.0 and info["success"] is True
    finally:
        await env.aclose()


async def test_a_wrong_value_is_submitted_and_earns_nothing() -> None:
    env = BrowserEnv("login", backend="pillow")
    await env.areset(seed=4)
    user = find(env.view.nodes, "textbox", "Username")
    password = find(env.view.nodes, "textbox", "Password")
    assert user is not None and password is not None
    assert env.site is not None
    await env.astep(say(f'type({user.id}, "{env.site.user}")'))  # type: ignore[attr-defined]
    await env.astep(say(f'type({password.id}, "wrong")'))
    obs, reward, terminated, _, _ = await env.astep(say("press(Enter)"))  # submits the form
    assert (reward, terminated) == (0.0, False)
    assert "Wrong username or password" in obs[0].text
    assert env.site.attempts == 1  # type: ignore[attr-defined]


def _wrong(step: PlanStep) -> PlanStep:
    """The step with a value the checker rejects (a select keeps to the page's options)."""
    if step.name == "Quantity":
        return dataclasses.replace(step, text="5" if step.text != "5" else "4")
    if step.name == "Time zone":
        return dataclasses.replace(step, text="UTC+9" if step.text != "UTC+9" else "UTC")
    return dataclasses.replace(step, text="nobody@example.org")


@pytest.mark.parametrize(
    ("task", "field", "credit"),
    [
        ("login", "Password", 1 / 2),
        ("form", "Email", 3 / 4),
        ("cart", "Quantity", 2 / 3),
        ("settings", "Time zone", 2 / 3),
        ("search", None, 1 / 2),
    ],
)
async def test_partial_credit_pays_the_share_of_checks_met_and_success_stays_binary(
    task: str, field: str | None, credit: float
) -> None:
    for partial in (True, False):
        env = BrowserEnv(task, backend="pillow", partial_credit=partial)
        await env.areset(seed=5)
        assert env.site is not None
        plan = [_wrong(s) if s.name == field else s for s in env.site.plan]
        if task == "search":  # the right search, then a result that is not the target
            target = plan[-1].name
            plan[-1] = PlanStep(verb="click", role="link", name="?")
        env.max_steps = len(plan)
        for step in plan:
            if step.name == "?":
                links = [n for n in walk(env.view.nodes) if n.role == "link"]
                other = next(n for n in links if n.name not in (target, "Back to results"))
                step = dataclasses.replace(step, name=other.name)
            obs, reward, terminated, truncated, info = await env.astep(
                say(str(plan_action(step, env.view.nodes)))
            )
        assert info["success"] is False and (terminated or truncated)
        assert reward == pytest.approx(credit if partial else 0.0), obs[0].text
        await env.aclose()


async def test_same_seed_same_screenshot_and_a_sized_png() -> None:
    shots = []
    for _ in range(2):
        env = BrowserEnv("form", backend="pillow", observe="both", device_scale=2.0)
        await env.areset(seed=3)
        shots.append(env.view.png)
        await env.aclose()
    assert shots[0] == shots[1]
    assert Image.open(io.BytesIO(shots[0])).size == (1600, 1200)
    other = BrowserEnv("form", backend="pillow", observe="both")
    await other.areset(seed=3)
    await other.astep(say('type(4, "Zoe Kim")'))  # typed text shows in the picture
    assert other.view.png != (await _fresh_png("form", 3))


async def _fresh_png(task: str, seed: int) -> bytes:
    env = BrowserEnv(task, backend="pillow", observe="both")
    await env.areset(seed=seed)
    return bytes(env.view.png)


@pytest.mark.parametrize("scale", [1.0, 2.0, 1.5])
async def test_click_by_coordinates_hits_the_element_at_that_pixel(scale: float) -> None:
    env = BrowserEnv("settings", backend="pillow", observe="both", device_scale=scale)
    await env.areset(seed=0)
    link = find(env.view.nodes, "link", "Settings")
    assert link is not None and link.box is not None
    x, y, w, h = link.box
    obs, *_ = await env.astep(say(f"click(x={(x + w / 2) * scale:g}, y={(y + h / 2) * scale:g})"))
    assert env.view.title == "Settings", obs[0].text
    box = find(env.view.nodes, "checkbox", "Email alerts")
    assert box is not None and box.box is not None and box.checked is False
    x, y, w, h = box.box
    await env.astep(say(f"click(x={(x + w / 2) * scale:g}, y={(y + h / 2) * scale:g})"))
    box = find(env.view.nodes, "checkbox", "Email alerts")
    assert box is not None and box.checked is True and box.focused
    await env.astep(say(f"click(x={(x + w + 300) * scale:g}, y={(y + h / 2) * scale:g})"))
    box = find(env.view.nodes, "checkbox", "Email alerts")  # its label runs the page's width
    assert box is not None and box.checked is False
    await env.astep(say(f"click(x={10 * scale:g}, y={590 * scale:g})"))  # the empty page
    box = find(env.view.nodes, "checkbox", "Email alerts")
    assert box is not None and box.checked is False and not box.focused


async def test_bad_actions_become_observations() -> None:
    env = BrowserEnv("form", backend="pillow", max_steps=20)
    await env.areset(seed=1)
    ids = {n.name: n.id for n in walk(env.view.nodes)}
    cases = bad_actions(ids)
    for reply, says in cases:
        obs, reward, terminated, truncated, info = await env.astep(say(reply))
        assert says in obs[0].text and says in info["error"], (reply, obs[0].text)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert "Page:\n[1] heading" in obs[0].text


async def test_links_off_the_site_are_blocked_and_slow_pages_time_out() -> None:
    slow = Response(body=html("<p>late</p>").body, delay_s=0.5)
    site = PagesSite(
        {
            "/": html(
                "<a href='http://evil.example/x'>away</a> <a href='/slow'>slow</a> "
                "<a href='/moved'>moved</a>"
            ),
            "/slow": slow,
            "/moved": Response(body="", status=302, headers={"Location": "http://evil.example/"}),
        }
    )
    pool = DrawnPool()
    session, error = await pool.open(site, SessionConfig(page_load_timeout_s=0.2))
    assert error is None
    nodes = (await session.observe()).nodes
    ids = {n.name: n.id for n in walk(nodes) if n.role == "link"}
    assert await session.act(Action(kind="click", element=ids["away"])) is None
    assert session.blocked["navigation"] == 1 and session.page is not None
    assert session.page.url == "http://task.agentrl/"  # stayed on the site
    err = await session.act(Action(kind="click", element=ids["slow"]))
    assert err == "page load timed out after 0.2 s"
    await session.act(Action(kind="click", element=ids["moved"]))
    assert session.blocked["redirect"] == 1
    assert [r.path for r in site.requests] == ["/", "/slow", "/moved"]
    await pool.release(session)
    assert pool.open_sessions == 0


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="backend must be 'chromium'"):
        make_env("gui/Browser-v0", backend="firefox")
    with pytest.raises(ConfigError, match="runs JavaScript"):
        make_env("gui/Browser-v0", task="miniwob/click-button", backend="pillow")


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")
@pytest.mark.parametrize("task", TASKS + CLICK_TASKS)
async def test_the_tree_the_model_reads_is_chromiums(task: str) -> None:
    """Along each oracle plan, every observation's text (action result, URL, title, element
    tree with ids, values and states) is the same from Chromium and from the drawn page."""
    envs = {b: BrowserEnv(task, backend=b, screenshots=False) for b in ("chromium", "pillow")}
    try:
        for seed in (0, 1):
            texts = {b: (await e.areset(seed=seed))[0][0].text for b, e in envs.items()}
            assert texts["chromium"] == texts["pillow"]
            chromium = envs["chromium"]
            assert chromium.site is not None
            for step in chromium.site.plan:
                act = say(str(plan_action(step, chromium.view.nodes)))
                results = {b: await e.astep(act) for b, e in envs.items()}
                assert results["chromium"][0][0].text == results["pillow"][0][0].text
                assert results["chromium"][1:3] == results["pillow"][1:3]  # reward, terminated
            assert results["pillow"][1] == 1.0
    finally:
        for e in envs.values():
            await e.aclose()
