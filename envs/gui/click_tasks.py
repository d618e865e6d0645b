"""Click tasks: sites where every action is a click on an element the instruction names.

    open     open the named link among six                                (1 action)
    press    press the named button among six                             (1 action)
    choose   pick the named radio button, click "Continue"                (2 actions)
    menu     open the named section, then the named item in it            (2 actions)
    tick     tick the two named boxes among six, click "Submit"           (3 actions)

The five types of ``tasks.py`` also need the agent to copy content into the page (a password
typed character by character, an option's text), which the small models trained from scratch
here do not learn (docs/guides/gui.md). These need no copy: each action is an element id,
found by matching the instruction's words against the element tree, so they are the first
rung of a GUI curriculum (``recipes/gui_click.yaml``). Names are an adjective and a noun drawn
per seed (six distinct nouns a page, so the noun tells the elements apart); the instruction
holds them, so the content split (``agentrl/splits.py``) keeps the targets of held-out tasks
out of training. A click on the wrong element ends the episode unrewarded (a choice, once made,
is graded), except in ``tick``, where a box can be unticked again before "Submit".
"""

from __future__ import annotations

import html
from collections.abc import Callable

import numpy as np

from envs.gui.tasks import ADJ, NOUN, PlanStep, Request, Response, Site, _pick, not_found, page

SECTIONS = ("Kitchen", "Garden", "Office", "Studio", "Garage", "Attic", "Cellar", "Porch")


def _names(rng: np.random.Generator, k: int) -> list[str]:
    """k names "adjective noun", nouns distinct."""
    return [f"{_pick(rng, ADJ)[0]} {n}" for n in _pick(rng, NOUN, k)]


class _ChoiceSite(Site):
    """Six named elements; the task is to act on ``names[target]``."""

    def __init__(self, rng: np.random.Generator, k: int = 6) -> None:
        super().__init__()
        self.names = _names(rng, k)
        self.target = int(rng.integers(0, k))

    def _finish(self, ok: bool) -> None:
        self.reward, self.done = (1.0 if self._grade(ok) else 0.0), True

    def _index(self, value: str) -> int | None:
        try:
            i = int(value)
        except ValueError:
            return None
        return i if 0 <= i < len(self.names) else None


class OpenSite(_ChoiceSite):
    name = "open"

    @property
    def instruction(self) -> str:
        return f'Open the link "{self.names[self.target]}".'

    @property
    def plan(self) -> list[PlanStep]:
        return [PlanStep(verb="click", role="link", name=self.names[self.target])]

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            rows = "".join(
                f"<li><a href='/item/{i}'>{html.escape(n)}</a></li>"
                for i, n in enumerate(self.names)
            )
            return page("Links", f"<h1>Links</h1><ul>{rows}</ul>")
        if request.path.startswith("/item/"):
            i = self._index(request.path.removeprefix("/item/"))
            if i is None:
                return not_found(request.path)
            self._finish(i == self.target)
            return page(self.names[i], f"<h1>{html.escape(self.names[i])}</h1>")
        return not_found(request.path)


class PressSite(_ChoiceSite):
    name = "press"

    @property
    def instruction(self) -> str:
        return f'Press the button "{self.names[self.target]}".'

    @property
    def plan(self) -> list[PlanStep]:
        return [PlanStep(verb="click", role="button", name=self.names[self.target])]

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            forms = "".join(
                f"<form method='post' action='/press'><input type='hidden' name='b' value='{i}'>"
                f"<button type='submit'>{html.escape(n)}</button></form>"
                for i, n in enumerate(self.names)
            )
            return page("Buttons", f"<h1>Buttons</h1>{forms}")
        if request.path == "/press" and request.method == "POST":
            i = self._index(request.form.get("b", ""))
            if i is None:
                return not_found(request.path)
            self._finish(i == self.target)
            return page("Pressed", f"<h1>Pressed</h1><p>{html.escape(self.names[i])}</p>")
        return not_found(request.path)


class ChooseSite(_ChoiceSite):
    name = "choose"

    @property
    def instruction(self) -> str:
        return f'Choose "{self.names[self.target]}" and click "Continue".'

    @property
    def plan(self) -> list[PlanStep]:
        return [
            PlanStep(verb="click", role="radio", name=self.names[self.target]),
            PlanStep(verb="click", role="button", name="Continue"),
        ]

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            radios = "".join(
                f"<label><input type='radio' name='pick' value='{i}'> {html.escape(n)}</label>"
                for i, n in enumerate(self.names)
            )
            return page(
                "Choose",
                "<h1>Choose one</h1><form method='post' action='/choose'>"
                f"{radios}<button type='submit'>Continue</button></form>",
            )
        if request.path == "/choose" and request.method == "POST":
            self._finish(self._index(request.form.get("pick", "")) == self.target)
            return page("Thank you", "<h1>Thank you</h1>")
        return not_found(request.path)


class MenuSite(Site):
    """Four sections of four items each; open the named item in the named section."""

    name = "menu"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.sections = _pick(rng, SECTIONS, 4)
        self.items = [_names(rng, 4) for _ in self.sections]
        self.section = int(rng.integers(0, 4))
        self.target = int(rng.integers(0, 4))

    @property
    def instruction(self) -> str:
        item = self.items[self.section][self.target]
        return f'Go to the section "{self.sections[self.section]}" and open "{item}".'

    @property
    def plan(self) -> list[PlanStep]:
        return [
            PlanStep(verb="click", role="link", name=self.sections[self.section]),
            PlanStep(verb="click", role="link", name=self.items[self.section][self.target]),
        ]

    def respond(self, request: Request) -> Response:
        nav = "<nav>" + " ".join(
            f"<a href='/s/{s}'>{html.escape(name)}</a>" for s, name in enumerate(self.sections)
        )
        nav += "</nav>"
        parts = request.path.strip("/").split("/")
        if request.path == "/":
            return page("Home", nav + "<h1>Home</h1><p>Pick a section.</p>")
        try:
            s = int(parts[1]) if parts[0] == "s" and len(parts) in (2, 3) else -1
            i = int(parts[2]) if len(parts) == 3 else None
        except ValueError:
            return not_found(request.path)
        if not 0 <= s < len(self.sections) or (i is not None and not 0 <= i < 4):
            return not_found(request.path)
        if i is None:
            rows = "".join(
                f"<li><a href='/s/{s}/{j}'>{html.escape(n)}</a></li>"
                for j, n in enumerate(self.items[s])
            )
            title = self.sections[s]
            return page(title, nav + f"<h1>{html.escape(title)}</h1><ul>{rows}</ul>")
        ok = self._grade(s == self.section, s == self.section and i == self.target)
        self.reward, self.done = (1.0 if ok else 0.0), True
        name = self.items[s][i]
        return page(name, nav + f"<h1>{html.escape(name)}</h1>")


class TickSite(_ChoiceSite):
    """Tick exactly the two named boxes, then submit."""

    name = "tick"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        first, second = sorted(int(i) for i in rng.choice(len(self.names), 2, replace=False))
        self.targets = (first, second)

    @property
    def instruction(self) -> str:
        a, b = (self.names[i] for i in self.targets)
        return f'Tick "{a}" and "{b}", then click "Submit".'

    @property
    def plan(self) -> list[PlanStep]:
        return [
            *(PlanStep(verb="click", role="checkbox", name=self.names[i]) for i in self.targets),
            PlanStep(verb="click", role="button", name="Submit"),
        ]

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            boxes = "".join(
                f"<label><input type='checkbox' name='c{i}'> {html.escape(n)}</label>"
                for i, n in enumerate(self.names)
            )
            return page(
                "Tick",
                "<h1>Tick the boxes</h1><form method='post' action='/tick'>"
                f"{boxes}<button type='submit'>Submit</button></form>",
            )
        if request.path == "/tick" and request.method == "POST":
            ticked = {i for i in range(len(self.names)) if f"c{i}" in request.form}
            want = set(self.targets)
            ok = self._grade(*(i in ticked for i in want), ticked <= want)
            self.reward, self.done = (1.0 if ok else 0.0), True
            return page("Thank you", "<h1>Thank you</h1>")
        return not_found(request.path)


CLICK_SITES: dict[str, Callable[[np.random.Generator], Site]] = {
    "open": OpenSite,
    "press": PressSite,
    "choose": ChooseSite,
    "menu": MenuSite,
    "tick": TickSite,
}
CLICK_TASKS = tuple(CLICK_SITES)
"""The click tasks by name."""
