"""``gui/Browser-v0``: a task website in real headless Chromium, operated through actions.

    env = make_env("gui/Browser-v0", task="login")  # or search, form, cart, settings; None: drawn
    obs, info = await env.areset(seed=0)   # [user: task + URL + title + element tree (+ PNG)]
    obs, reward, terminated, truncated, info = await env.astep(assistant("type(3, \"mira\")"))

Each episode gets a fresh, isolated browser context from the process's one Chromium
(``envs/gui/session.py``) showing a site built from the seed (``envs/gui/tasks.py``). The
action is the last action line of the assistant's reply (``envs/gui/actions.py``); the
observation is one user message with the action's outcome, the URL, the title and the pruned
element tree (``envs/gui/tree.py``), plus the screenshot as an image part when
``observe="both"`` or ``"screenshot"`` (the PNG of the last step is at ``env.view.png``;
``screenshots=False`` skips taking it in text mode, which saves CPU when no one looks;
``marks=True`` draws a set-of-marks overlay on the image the model sees, ``env.image``:
every element framed and labelled with its tree id, ``envs/gui/marks.py``). A reply without a
valid action, an action on a missing or disabled element, a key that does not exist, a page
that does not load in time: each becomes an observation the agent reads (and ``info["error"]``), never an exception. The site's checker sets the reward;
the episode ends when the task is done (login accepted, result opened, form sent,
order placed, settings saved) or after
``max_steps`` actions (truncated). ``ids="after"`` writes each element's id after its name
(``button "Go" [7]``, not ``[7] button "Go"``; ``envs/gui/tree.py``); ``quote_target=True``
makes the oracle's replies name the element before acting on it (``button "Go" [7]`` on a
line of its own, then ``click(7)``). ``partial_credit=True`` pays an episode that did not
succeed the best share of the checker's conditions that one of its submissions met (the
password right but not the username: 0.5; three of a form's four fields: 0.75), a denser
signal for RL; ``info["success"]`` and the success rate stay all or nothing.

The train/eval split is by content: ``info["task_key"]`` is the task type and its instruction
(user and password, query and target, the form's values), and a reset asked for a split
(``options["split"]``) redraws the site's content until it falls there, before any browser
work (``agentrl/splits.py``).

The env is declared nondeterministic (a real browser: timing, fonts, a GPU-less compositor),
though the same seed gives the same pages, trees and screenshots on one machine (a test
checks). ``ademonstration`` plays the task's plan from the same reset and records it.

``backend="pillow"`` serves our five task sites without a browser (``envs/gui/drawn.py``): the
same observation and action types and, along the oracle plans, the same tree text as
Chromium's (a test checks); for machines where Chromium cannot run.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from agentrl.env import Env, Info, Observation, StepResult, run_sync
from agentrl.errors import ConfigError, EnvError
from agentrl.splits import DEFAULT_EVAL_FRACTION, MAX_DRAWS, split_of
from agentrl.types import Message
from envs.gui.actions import HELP, Action, ActionError, parse_action
from envs.gui.click_tasks import CLICK_SITES, CLICK_TASKS
from envs.gui.marks import set_of_marks
from envs.gui.tasks import SITES, TASKS, PlanStep, Site
from envs.gui.tree import ID_STYLES, IdStyle, Node, find, label, render
from envs.gui.view import SessionConfig

Observe = Literal["text", "screenshot", "both"]
Backend = Literal["chromium", "pillow"]


class BrowserEnv(Env):
    """A task site in headless Chromium; text and/or screenshot observations, browser actions."""

    nondeterministic = True

    def __init__(
        self,
        task: str | Sequence[str] | None = None,
        *,
        observe: Observe = "text",
        max_steps: int = 12,
        viewport: tuple[int, int] = (800, 600),
        device_scale: float = 1.0,
        action_timeout_s: float = 2.0,
        page_load_timeout_s: float = 5.0,
        max_contexts: int = 16,
        screenshots: bool = True,
        marks: bool = False,
        backend: Backend = "chromium",
        partial_credit: bool = False,
        ids: IdStyle = "before",
        quote_target: bool = False,
    ) -> None:
        if backend not in ("chromium", "pillow"):
            raise ConfigError(
                f"gui/Browser-v0: backend must be 'chromium' (a real browser) or 'pillow' "
                f"(pages drawn without a browser, envs/gui/drawn.py), got {backend!r}"
            )
        tasks = _task_list(task)
        miniwob = [t for t in tasks if t.startswith("miniwob/")]
        if backend == "pillow" and miniwob:
            raise ConfigError(
                f"gui/Browser-v0: {miniwob[0]!r} runs JavaScript, which the pillow backend does "
                "not; use backend='chromium'"
            )
        if observe not in ("text", "screenshot", "both"):
            raise ConfigError(
                f"gui/Browser-v0: observe must be text, screenshot or both, got {observe!r}"
            )
        if ids not in ID_STYLES:
            raise ConfigError(
                f"gui/Browser-v0: ids must be 'before' ('[7] button \"Go\"') or 'after' "
                f"('button \"Go\" [7]'), got {ids!r}"
            )
        if max_steps < 1:
            raise ConfigError(f"gui/Browser-v0: max_steps must be >= 1, got {max_steps}")
        if marks and observe == "text":
            raise ConfigError(
                "gui/Browser-v0: marks=True draws on the screenshot the model sees; set "
                "observe to 'both' or 'screenshot', or leave marks off in text mode"
            )
        self.task = task  # may be reassigned between episodes (benchmarks/gui.py does)
        self.observe = observe
        self.max_steps = max_steps
        self.max_contexts = max_contexts
        self.screenshots = screenshots or observe != "text"
        self.marks = marks
        self.image = b""  # the PNG the last observation showed (set-of-marks drawn when marks)
        self.config = SessionConfig(
            viewport=(int(viewport[0]), int(viewport[1])),
            device_scale=float(device_scale),
            action_timeout_s=action_timeout_s,
            page_load_timeout_s=page_load_timeout_s,
        )
        self.backend = backend
        self.partial_credit = partial_credit
        self.ids = ids
        self.quote_target = quote_target
        self.pool: Any
        if backend == "pillow":
            from envs.gui.drawn import DrawnPool

            self.pool = DrawnPool()
        else:
            from envs.gui.session import BrowserPool  # playwright: the gui extra

            self.pool = BrowserPool.shared(max_contexts)
        self.site: Site | None = None
        self.session: Any = None
        self.view: Any = None  # the last PageView (screenshot, nodes, url, title)
        self.steps = 0
        self._seed: int | None = None
        self._options: dict[str, Any] | None = None

    # --- episode ----------------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        if seed is None:  # a seed of its own, so that ademonstration can replay this reset
            seed = int(self.np_random.integers(2**31))
        await super().areset(seed=seed)
        await self.aclose()
        self._seed, self._options = seed, options
        self.site = self._draw_site(options or {})
        task = self.site.name
        self.steps = 0
        self.session, error = await self.pool.open(self.site, self.config)
        text = f"Task: {self.site.instruction}\n{HELP}"
        obs = await self._observation(text, error)
        info = {"task": task, "task_key": self.site_key(self.site), "url": self.view.url}
        return obs, {**info, "title": self.view.title, "error": error}

    @staticmethod
    def site_key(site: Site) -> str:
        """What names a task for the train/eval split: its type and instruction (the content)."""
        return f"{site.name}: {site.instruction}"

    def _draw_site(self, options: dict[str, Any]) -> Site:
        """The episode's site; with ``options["split"]``, redrawn (cheaply, before any browser
        work) until its content falls in that split (``agentrl.splits``)."""
        split = options.get("split")
        fraction = float(options.get("eval_fraction", DEFAULT_EVAL_FRACTION))
        tasks = _task_list(self.task)
        for _ in range(MAX_DRAWS):
            task = tasks[int(self.np_random.integers(len(tasks)))]
            site = make_site(task, self.np_random)
            if split is None or site.name == "miniwob":  # its content is known after it loads
                return site
            if split_of(self.site_key(site), fraction) == split:
                return site
        raise EnvError(f"gui/Browser-v0: {MAX_DRAWS} draws found no {split!r} task")

    async def astep(self, action: Message) -> StepResult:
        if self.session is None or self.site is None:
            raise RuntimeError("gui/Browser-v0: call reset() before step()")
        self.steps += 1
        error: str | None
        try:
            parsed: Action | None = parse_action(Message.coerce(action).text)
        except ActionError as e:
            parsed, error = None, f"invalid action: {e}"
        if parsed is not None:
            error = await self.pool.work(self.session.act(parsed))
        hook_error = await self.pool.work(self.session.page_hook(self.site.on_step))
        error = error or hook_error
        head = f"Action: {parsed}" if parsed is not None else "Action: none"
        head += f"\nError: {error}" if error else "\nResult: ok"
        obs = await self._observation(head, None)
        terminated = self.site.done
        truncated = not terminated and self.steps >= self.max_steps
        reward = self.site.reward if terminated else 0.0
        if self.partial_credit and (terminated or truncated) and reward < 1.0:
            reward = self.site.credit  # the best submission's share of the checks
        info: Info = {
            "error": error,
            "url": self.view.url,
            "title": self.view.title,
            "blocked": dict(self.session.blocked),
        }
        if terminated or truncated:
            info["success"] = terminated and self.site.reward > 0  # the checker's, not credit
        return obs, reward, terminated, truncated, info

    async def _observation(self, head: str, error: str | None) -> Observation:
        try:
            self.view = await self.pool.work(self.session.observe(screenshot=self.screenshots))
        except Exception as e:  # the page or the browser is gone: infrastructure, not the agent
            raise EnvError(
                f"gui/Browser-v0: could not read the page: {type(e).__name__}: {e}"
            ) from e
        lines = [head] + ([f"Error: {error}"] if error else [])
        dialogs = self.session.dialogs
        if dialogs:
            lines.append("Dialogs dismissed: " + "; ".join(dialogs))
            dialogs.clear()
        lines += [f"URL: {self.view.url}", f"Title: {self.view.title}"]
        if self.observe != "screenshot":
            lines += ["Page:", render(self.view.nodes, ids=self.ids) or "(empty page)"]
        text = "\n".join(lines)
        if self.observe == "text":
            return [Message(role="user", content=text)]
        self.image = self.view.png
        if self.marks:
            self.image = set_of_marks(
                self.view.png, self.view.nodes, scale=self.config.device_scale
            )
        url = "data:image/png;base64," + base64.b64encode(self.image).decode()
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return [Message(role="user", content=parts)]

    async def aclose(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await self.pool.release(session)

    # --- the oracle -----------------------------------------------------------------------
    def demonstration(self) -> list[Message] | None:
        """``ademonstration`` from sync code (the env checker); inside an event loop, await
        ``ademonstration()`` instead."""
        return run_sync(self.ademonstration())

    async def ademonstration(self) -> list[Message] | None:
        """Play the task's plan and record the conversation; the env is then reset again to the
        same task, as it was (one browser context at a time: no second context is held)."""
        if self._seed is None or self.site is None or not self.site.plan:
            return None
        seed, options = self._seed, self._options
        try:
            await self.areset(seed=seed, options=options)
            assert self.site is not None
            out: list[Message] = []
            for step in self.site.plan:
                node = plan_target(step, self.view.nodes)
                text = str(plan_action(step, self.view.nodes, node))
                if self.quote_target:
                    text = f"{label(node, ids=self.ids)}\n{text}"
                reply = Message(role="assistant", content=text)
                obs, *_ = await self.astep(reply)
                out += [reply, *obs]
            return out
        finally:
            await self.areset(seed=seed, options=options)


def _task_list(task: str | Sequence[str] | None) -> tuple[str, ...]:
    """The task types an env draws from: one, several (a list), or None (``TASKS``)."""
    if task is None:
        return TASKS
    tasks = (task,) if isinstance(task, str) else tuple(task)
    known = TASKS + CLICK_TASKS
    bad = [
        t
        for t in tasks
        if not isinstance(t, str) or (t not in known and not t.startswith("miniwob/"))
    ]
    if not tasks or bad:
        raise ConfigError(
            f"gui/Browser-v0: unknown task {bad[0] if bad else task!r}; expected one of {known}, "
            "'miniwob/<name>' (a MiniWoB++ task), a list of these (one drawn per episode) or "
            "None (one of the first five)"
        )
    return tasks


def make_site(task: str, rng: np.random.Generator) -> Site:
    """The site of ``task`` (one of ``TASKS`` or ``CLICK_TASKS``, or ``miniwob/<name>``) with
    content from ``rng``.

    Here rather than in ``tasks.py``: ``miniwob.py`` builds on ``tasks.py``, so only the env
    knows both."""
    if task.startswith("miniwob/"):
        from envs.gui.miniwob import MiniWoBSite

        return MiniWoBSite(task.removeprefix("miniwob/"), seed=int(rng.integers(2**31)))
    return {**SITES, **CLICK_SITES}[task](rng)


def plan_target(step: PlanStep, nodes: list[Node]) -> Node:
    """The element one plan step acts on, in the page whose tree is ``nodes``."""
    node = find(nodes, step.role, step.name)
    if node is None or node.id is None:
        raise LookupError(f"no {step.role} named {step.name!r} on the page")
    return node


def plan_action(step: PlanStep, nodes: list[Node], node: Node | None = None) -> Action:
    """The action doing one plan step on the page whose tree is ``nodes`` (a scripted policy);
    ``node``: its target, when the caller has found it already (``plan_target``)."""
    node = node or plan_target(step, nodes)
    if step.verb == "click":
        return Action(kind="click", element=node.id)
    if step.verb == "type":
        return Action(kind="type", element=node.id, text=step.text)
    return Action(kind="select", element=node.id, text=step.text)
