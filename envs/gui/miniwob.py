"""MiniWoB++ tasks from the ``miniwob`` package, served to our browser with the page's reward.

    site = MiniWoBSite("click-button", seed=3)   # task=miniwob/click-button in gui/Browser-v0
    miniwob_tasks()                              # every packaged task name (130 in miniwob 1.1)

The ``miniwob`` package (PyPI, installed with the gui extra) ships each task as an HTML page
with the task's JavaScript (``miniwob/html/miniwob/*.html`` + ``core/``). Here those files are
served at ``tasks.ORIGIN`` like our own sites (through Playwright's routing; the package's
Selenium driver is not used). After the page loads, ``on_start`` seeds the page's random
generator (``Math.seedrandom``), lifts the 10 s episode timer (a model may think for longer)
and starts the episode; the instruction is the page's utterance. After every action
``on_step`` reads the page's own reward: ``WOB_RAW_REWARD_GLOBAL`` (in [-1, 1], without the
time penalty) once ``WOB_DONE_GLOBAL`` is set. No oracle plans exist for these tasks.
"""

from __future__ import annotations

import importlib.util
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from envs.gui.tasks import PlanStep, Request, Response, Site, not_found

Evaluate = Callable[[str], Awaitable[Any]]
EPISODE_MS = 1_000_000_000  # the page's episode timer (setTimeout takes at most 2**31 - 1 ms)


def miniwob_root() -> Path:
    """The ``html`` folder of the installed miniwob package (ConfigError when missing)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("MiniWoB tasks need the miniwob package: pip install -e '.[gui]'")
    return Path(next(iter(spec.submodule_search_locations))) / "html"


def miniwob_tasks() -> list[str]:
    """Every task the package ships, by name (``click-button``, ...)."""
    return sorted(p.stem for p in (miniwob_root() / "miniwob").glob("*.html"))


class MiniWoBSite(Site):
    """One packaged MiniWoB++ task; the page computes the reward."""

    name = "miniwob"

    def __init__(self, task: str, seed: int) -> None:
        super().__init__()
        self.root = miniwob_root().resolve()
        if not (self.root / "miniwob" / f"{task}.html").is_file():
            raise ConfigError(f"no MiniWoB task {task!r}; see envs.gui.miniwob.miniwob_tasks()")
        self.task = task
        self.seed = seed
        self.start_path = f"/miniwob/{task}.html"
        self.utterance = ""
        self.state: dict[str, Any] = {}

    @property
    def instruction(self) -> str:
        return self.utterance or f"(MiniWoB {self.task}: the page gave no instruction)"

    @property
    def plan(self) -> list[PlanStep]:
        return []

    def respond(self, request: Request) -> Response:
        path = (self.root / request.path.lstrip("/")).resolve()
        if not path.is_file() or not path.is_relative_to(self.root):
            return not_found(request.path)
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return Response(body=path.read_bytes(), content_type=kind)

    async def on_start(self, evaluate: Evaluate) -> None:
        await evaluate(
            f"() => {{ core.EPISODE_MAX_TIME = {EPISODE_MS}; Math.seedrandom({self.seed}); "
            "core.startEpisodeReal(); }"
        )
        self.utterance = str(await evaluate("() => core.getUtterance()"))

    async def on_step(self, evaluate: Evaluate) -> None:
        self.state = await evaluate(
            "() => ({done: WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL, "
            "reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON})"
        )
        if self.state.get("done"):
            self.done, self.reward = True, float(self.state.get("raw_reward") or 0.0)
