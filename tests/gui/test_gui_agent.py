"""GUIAgentLoop through the rollout collector: a scripted policy that reads only its prompt
solves every task (so the tasks are solvable through the loop), and the history window cuts
old pages."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.errors import ConfigError
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.tiny import build_tokenizer
from agentrl.types import Message, RolloutStatus, Sample
from agents.gui_agent import ELIDED, GUIAgentLoop, GUIContext

ELEMENT = re.compile(
    r'^\s*\[(\d+)\] (\w+)(?: "([^"]*)")?(?: value="([^"]*)")?(?: (checked|unchecked))?'
)


def last_page(prompt: str) -> list[tuple[int, str, str, str | None, str | None]]:
    """The elements of the newest page in the prompt: (id, role, name, value, checked)."""
    page = prompt.rsplit("\nPage:\n", 1)[1]
    return [
        (int(m[1]), m[2], m[3] or "", m[4], m[5])
        for line in page.splitlines()
        if (m := ELEMENT.match(line))
    ]


def policy(prompt: str, turn: int) -> str:
    """A scripted agent: reads the task and the newest page from the prompt, picks an action."""
    task = re.search(r"Task: (.*)", prompt)
    assert task is not None
    quoted = re.findall(r'"([^"]*)"', task[1])
    els = last_page(prompt)

    def el(role: str, name: str) -> tuple[int, str | None, str | None]:
        found = [(i, v, c) for i, r, n, v, c in els if r == role and name in n]
        assert found, (role, name, els)
        return found[0]

    def fill(role: str, name: str, text: str) -> str | None:
        i, value, _ = el(role, name)
        return None if value == text else f'type({i}, "{text}")'

    if task[1].startswith("Log in"):
        user, password = quoted
        return (
            fill("textbox", "Username", user)
            or fill("textbox", "Password", password)
            or f"click({el('button', 'Sign in')[0]})"
        )
    if task[1].startswith("Search"):
        query, target = quoted
        links = [i for i, r, n, _, _ in els if r == "link" and n == target]
        if links:
            return f"Found it.\nclick({links[0]})"
        return fill("searchbox", "Search", query) or f"click({el('button', 'Search')[0]})"
    if task[1].startswith("Buy"):
        quantity, item = task[1].split()[1], quoted[0]
        roles = {(r, n) for _, r, n, _, _ in els}
        if ("button", "Check out") in roles:
            return f"click({el('button', 'Check out')[0]})"
        if ("combobox", "Quantity") not in roles:
            return f"click({el('link', item)[0]})"
        i, value, _ = el("combobox", "Quantity")
        return (
            f'select({i}, "{quantity}")'
            if value != quantity
            else f"click({el('button', 'Add')[0]})"
        )
    if task[1].startswith("Open the settings"):
        language, zone = quoted
        if not any(r == "combobox" for _, r, _, _, _ in els):
            return f"click({el('link', 'Settings')[0]})"
        (lang, lv, _), (tz, zv, _) = el("combobox", "Language"), el("combobox", "Time zone")
        box, _, checked = el("checkbox", "Email alerts")
        want = "turn email alerts on" in task[1]
        return (
            (f'select({lang}, "{language}")' if lv != language else None)
            or (f'select({tz}, "{zone}")' if zv != zone else None)
            or (f"click({box})" if (checked == "checked") != want else None)
            or f"click({el('button', 'Save')[0]})"
        )
    name, email, country = quoted
    i, value, _ = el("combobox", "Country")
    box, _, checked = el("checkbox", "newsletter")
    want = "do not subscribe" not in task[1]
    return (
        fill("textbox", "Full name", name)
        or fill("textbox", "Email", email)
        or (f'select({i}, "{country}")' if value != country else None)
        or (f"click({box})" if (checked == "checked") != want else None)
        or f"click({el('button', 'Send')[0]})"
    )


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(build_tokenizer())


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")
@pytest.mark.parametrize(
    ("task", "window"),
    [("login", 0), ("search", 0), ("form", 2), ("cart", 0), ("settings", 2)],
)
async def test_a_scripted_policy_solves_each_task_through_the_loop(
    template: ChatTemplate, task: str, window: int
) -> None:
    gen = ScriptedGenerator(template, policy)
    cfg = CollectorConfig(
        group_size=2,
        agent="gui",
        agent_options={"history_window": window},
        check_ledger=True,
        max_turns=8,
        max_tokens=16384,
    )
    samples = [
        Sample(env_id="gui/Browser-v0", env_kwargs={"task": task}, seed=s, split="eval")
        for s in (0, 1)
    ]
    groups = await RolloutCollector(cfg, gen, template).collect(samples)
    for group in groups:
        for traj in group.trajectories:
            assert traj.status is RolloutStatus.COMPLETED, traj.error
            assert traj.reward == 1.0 and traj.metrics["success"] == 1.0
            assert traj.num_turns >= 3
            if window == 0:
                # (the ledger check renders every segment from the final messages, so after
                # a cut the earlier segments cannot match: checked without a window)
                assert traj.metrics["ledger_mismatch"] == 0.0
            elif traj.num_turns >= 4:  # the window of 2 pages was exceeded: old pages were cut
                assert traj.metrics["compactions"] >= 1 and len(traj.segments) >= 2
                assert any(ELIDED in m.text for m in traj.messages if m.role == "user")


def test_history_window_cuts_old_pages_and_keeps_their_head(template: ChatTemplate) -> None:
    ctx = GUIContext(
        sample=Sample(env_id="x"), generator=ScriptedGenerator(template, ["x"]), template=template
    )
    ctx.history_window = 2

    def page(n: int) -> Message:
        return Message(
            role="user", content=f"Action: click({n})\nResult: ok\nURL: u{n}\nPage:\n[{n}] button"
        )

    ctx.observe([Message(role="user", content="Task: t\nURL: u0\nPage:\n[1] heading")], "reset")
    for n in range(1, 4):
        ctx.messages.append(Message(role="assistant", content=f"click({n})"))
        ctx.observe([page(n)], "step")
    assert ctx.compact() == 2  # 4 pages, window 2: the two oldest are cut, in one batch
    texts = [m.text for m in ctx.messages if m.role == "user"]
    assert texts[0] == "Task: t\nURL: u0" + ELIDED
    assert texts[1] == "Action: click(1)\nResult: ok\nURL: u1" + ELIDED
    assert texts[2:] == [page(2).text, page(3).text]
    assert ctx.compact() == 0  # nothing more has aged out yet
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "Page:\n[1] x"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
    ]
    [shown] = ctx.observe([Message(role="user", content=parts)], "step")
    assert shown.content == "Page:\n[1] x"  # text mode: the screenshot is dropped


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="history_window"):
        GUIAgentLoop(history_window=-1)
    with pytest.raises(ConfigError, match=r"'text'.*'vision'"):
        GUIAgentLoop(mode="pixels")  # type: ignore[arg-type]


def test_vision_mode_keeps_screenshots_and_the_window_cuts_them(template: ChatTemplate) -> None:
    ctx = GUIContext(
        sample=Sample(env_id="x"), generator=ScriptedGenerator(template, ["x"]), template=template
    )
    ctx.history_window, ctx.mode = 1, "vision"

    def shot(n: int) -> Message:  # observe="screenshot": no element tree, only the image
        return Message(
            role="user",
            content=[
                {"type": "text", "text": f"Action: click({n})\nURL: u{n}"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{n}"}},
            ],
        )

    [shown] = ctx.observe([shot(0)], "reset")
    assert shown.content == shot(0).content  # vision mode: the screenshot stays
    ctx.messages.append(Message(role="assistant", content="click(1)"))
    ctx.observe([shot(1)], "step")
    assert ctx.compact() == 1  # 2 pages, window 1: the older one loses its screenshot
    first, last = (m for m in ctx.messages if m.role == "user")
    assert first.content == "Action: click(0)\nURL: u0" + ELIDED
    assert last.content == shot(1).content
