"""MiniWoB++ tasks from the miniwob package in gui/Browser-v0: every packaged task loads and
reports the page's reward; a few are solved (reward 1) and failed (reward below 0) by actions."""

from __future__ import annotations

import asyncio
import importlib.util
import re

import pytest

from agentrl.types import Message
from envs.gui.env import BrowserEnv
from envs.gui.tree import Node, walk

pytestmark = [
    pytest.mark.browser,
    pytest.mark.usefixtures("chromium"),
    pytest.mark.skipif(
        importlib.util.find_spec("miniwob") is None, reason="no miniwob: pip install -e '.[gui]'"
    ),
]


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def named(nodes: list[Node], role: str, name: str) -> int:
    [node] = [n for n in walk(nodes) if n.role == role and n.name == name and n.id is not None]
    assert node.id is not None
    return node.id


@pytest.mark.slow  # 130 tasks, four at a time (contexts of one browser)
async def test_every_packaged_task_loads_and_reports_the_page_reward() -> None:
    from envs.gui.miniwob import miniwob_tasks

    tasks = miniwob_tasks()
    assert len(tasks) >= 100 and "click-button" in tasks
    todo = list(tasks)
    failed: dict[str, str] = {}
    checked: list[str] = []

    async def check(env: BrowserEnv, name: str) -> None:
        env.task = f"miniwob/{name}"
        _, info = await env.areset(seed=0)
        _, reward, terminated, _, step_info = await env.astep(say("scroll(down)"))
        state = env.site.state  # type: ignore[union-attr]
        checked.append(name)
        if (
            info["error"]
            or step_info["error"]
            or set(state) != {"done", "raw_reward", "reward", "reason"}
        ):
            failed[name] = str(info["error"] or step_info["error"] or state)
        elif terminated != bool(state["done"]) or (terminated and reward != state["raw_reward"]):
            failed[name] = f"reward {reward} / terminated {terminated} do not follow {state}"

    async def worker() -> None:  # each env holds one context at a time
        env = BrowserEnv(action_timeout_s=1.0)
        try:
            while todo:
                await check(env, todo.pop())
        finally:
            await env.aclose()

    await asyncio.gather(*(worker() for _ in range(4)))
    assert sorted(checked) == sorted(tasks)  # every task, once
    assert not failed, failed


async def test_click_button_right_and_wrong() -> None:
    env = BrowserEnv("miniwob/click-button")
    try:
        obs, _ = await env.areset(seed=1)
        m = re.search(r'Click on the "([^"]+)" button', obs[0].text)
        assert m is not None, obs[0].text
        _, reward, terminated, _, _ = await env.astep(
            say(f"click({named(env.view.nodes, 'button', m[1])})")
        )
        assert (reward, terminated) == (1.0, True)
        obs, _ = await env.areset(seed=1)
        wrong = next(n for n in walk(env.view.nodes) if n.role == "button" and n.name != m[1])
        _, reward, terminated, _, info = await env.astep(say(f"click({wrong.id})"))
        assert terminated and reward < 0 and info["success"] is False
    finally:
        await env.aclose()


async def test_enter_text_click_link_and_checkboxes() -> None:
    env = BrowserEnv()
    try:
        env.task = "miniwob/enter-text"
        _, info = await env.areset(seed=2)
        text = re.search(r'Enter "(.+)" into the text field', info["task_key"])
        assert text is not None
        box = next(n.id for n in walk(env.view.nodes) if n.role == "textbox")
        assert (await env.astep(say(f'type({box}, "{text[1]}")')))[2] is False
        _, reward, terminated, *_ = await env.astep(
            say(f"click({named(env.view.nodes, 'button', 'Submit')})")
        )
        assert (reward, terminated) == (1.0, True)

        env.task = "miniwob/click-link"
        _, info = await env.areset(seed=3)
        link = re.search(r'Click on the link "(.+)"', info["task_key"])
        assert link is not None
        _, reward, terminated, *_ = await env.astep(
            say(f"click({named(env.view.nodes, 'clickable', link[1])})")
        )
        assert (reward, terminated) == (1.0, True)

        env.task = "miniwob/click-checkboxes"
        _, info = await env.areset(seed=4)
        m = re.search(r"Select (.*) and click Submit", info["task_key"])
        assert m is not None
        wanted = [w for w in re.split(r",\s*|\s+", m[1]) if w] if m[1] != "nothing" else []
        for w in wanted:
            await env.astep(say(f"click({named(env.view.nodes, 'checkbox', w)})"))
        _, reward, terminated, *_ = await env.astep(
            say(f"click({named(env.view.nodes, 'button', 'Submit')})")
        )
        assert (reward, terminated) == (1.0, True)
    finally:
        await env.aclose()
