"""The click tasks (envs/gui/click_tasks.py) on drawn pages: a wrong choice is graded and
ends the episode, a task list draws each type, and the content split keeps held-out targets
out of training."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.env import make_env
from agentrl.errors import ConfigError
from agentrl.splits import split_of
from agentrl.types import Message
from envs.gui.click_tasks import CLICK_TASKS
from envs.gui.env import BrowserEnv
from envs.gui.tree import find


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


@pytest.mark.parametrize(("task", "role"), [("open", "link"), ("press", "button")])
async def test_a_click_on_another_element_ends_the_episode_unrewarded(task: str, role: str) -> None:
    env = BrowserEnv(task, backend="pillow", screenshots=False)
    try:
        await env.areset(seed=5)
        site = env.site
        assert site is not None
        other = site.names[(site.target + 1) % len(site.names)]  # type: ignore[attr-defined]
        node = find(env.view.nodes, role, other)
        assert node is not None
        _, reward, terminated, truncated, info = await env.astep(say(f"click({node.id})"))
        assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    finally:
        await env.aclose()


async def test_choose_grades_the_radio_that_is_checked_when_continue_is_clicked() -> None:
    env = BrowserEnv("choose", backend="pillow", screenshots=False)
    try:
        for pick_target, want in ((True, 1.0), (False, 0.0)):
            await env.areset(seed=7)
            site = env.site
            assert site is not None
            names = site.names  # type: ignore[attr-defined]
            i = site.target if pick_target else (site.target + 2) % len(names)  # type: ignore[attr-defined]
            radio = find(env.view.nodes, "radio", names[i])
            assert radio is not None
            obs, reward, terminated, *_ = await env.astep(say(f"click({radio.id})"))
            assert not terminated and f'radio "{names[i]}" checked' in obs[0].text
            button = find(env.view.nodes, "button", "Continue")
            assert button is not None
            _, reward, terminated, *_ = await env.astep(say(f"click({button.id})"))
            assert (reward, terminated) == (want, True)
    finally:
        await env.aclose()


async def test_tick_needs_exactly_the_two_named_boxes() -> None:
    env = BrowserEnv("tick", backend="pillow", screenshots=False, partial_credit=True)
    try:
        await env.areset(seed=2)
        site = env.site
        assert site is not None
        names, (a, b) = site.names, site.targets  # type: ignore[attr-defined]
        extra = next(i for i in range(len(names)) if i not in (a, b))
        for i in (a, b, extra):  # one box too many
            node = find(env.view.nodes, "checkbox", names[i])
            assert node is not None
            await env.astep(say(f"click({node.id})"))
        submit = find(env.view.nodes, "button", "Submit")
        assert submit is not None
        _, reward, terminated, _, info = await env.astep(say(f"click({submit.id})"))
        assert terminated and info["success"] is False
        assert reward == pytest.approx(2 / 3)  # both named boxes, but not only them
    finally:
        await env.aclose()


async def test_menu_opens_the_item_in_the_named_section_only() -> None:
    env = BrowserEnv("menu", backend="pillow", screenshots=False)
    try:
        await env.areset(seed=3)
        site = env.site
        assert site is not None
        s, t = site.section, site.target  # type: ignore[attr-defined]
        other = (s + 1) % 4
        node = find(env.view.nodes, "link", site.sections[other])  # type: ignore[attr-defined]
        assert node is not None
        obs, reward, terminated, *_ = await env.astep(say(f"click({node.id})"))
        assert not terminated and f"/s/{other}" in obs[0].text
        item = find(env.view.nodes, "link", site.items[other][t])  # type: ignore[attr-defined]
        assert item is not None
        _, reward, terminated, *_ = await env.astep(say(f"click({item.id})"))
        assert (reward, terminated) == (0.0, True)
    finally:
        await env.aclose()


async def test_a_task_list_draws_each_type_and_the_split_holds_targets_out() -> None:
    env = make_env("gui/Browser-v0", task=list(CLICK_TASKS), backend="pillow", screenshots=False)
    seen: dict[str, set[str]] = {"train": set(), "eval": set()}
    types: Counter[str] = Counter()
    try:
        for seed in range(60):
            split = "eval" if seed % 4 == 0 else "train"
            _, info = await env.areset(seed=seed, options={"split": split, "eval_fraction": 0.25})
            assert split_of(info["task_key"], 0.25) == split
            seen[split].add(info["task_key"])
            types[info["task"]] += 1
    finally:
        await env.aclose()
    assert set(types) == set(CLICK_TASKS)
    assert not seen["train"] & seen["eval"]


def test_unknown_tasks_in_a_list_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown task 'opne'"):
        make_env("gui/Browser-v0", task=["open", "opne"], backend="pillow")
    with pytest.raises(ConfigError, match="unknown task"):
        make_env("gui/Browser-v0", task=[], backend="pillow")
    with pytest.raises(ConfigError, match="runs JavaScript"):
        make_env("gui/Browser-v0", task=["open", "miniwob/click-button"], backend="pillow")


async def test_a_task_set_between_episodes_is_the_next_ones() -> None:
    env = BrowserEnv("open", backend="pillow", screenshots=False)
    try:
        assert (await env.areset(seed=1))[1]["task"] == "open"
        env.task = ["press", "tick"]  # as benchmarks/gui.py sets it between sessions
        assert {(await env.areset(seed=s))[1]["task"] for s in range(12)} == {"press", "tick"}
    finally:
        await env.aclose()


async def test_ids_after_names_and_quoted_targets_still_solve_every_task() -> None:
    """With ``ids="after"`` the tree writes ``link "small clock" [3]``; with
    ``quote_target`` each oracle reply names its element on the line before the action, and
    the action parsed from that reply is the one that solves the task."""
    env = BrowserEnv(
        list(CLICK_TASKS), backend="pillow", screenshots=False, ids="after", quote_target=True
    )
    try:
        for seed in range(5):
            obs, _ = await env.areset(seed=seed)
            demo = await env.ademonstration()
            assert demo is not None
            page = obs[0].text.split("Page:\n", 1)[1]
            assert 'link "' in page or 'button "' in page or 'radio "' in page or "box" in page
            assert all(not line.lstrip().startswith("[") for line in page.splitlines())
            for m in demo:
                if m.role == "user":
                    page = m.text.split("Page:\n", 1)[1]
                    continue
                quote, action = m.text.splitlines()
                element = action.removeprefix("click(").removesuffix(")")
                assert quote.endswith(f" [{element}]"), m.text
                assert any(line.strip().startswith(quote) for line in page.splitlines())
                _, reward, terminated, _, info = await env.astep(m)
            assert (reward, terminated, info["success"]) == (1.0, True, True)
    finally:
        await env.aclose()


def test_an_unknown_id_style_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ids must be 'before'"):
        BrowserEnv("open", backend="pillow", ids="inside")  # type: ignore[arg-type]
