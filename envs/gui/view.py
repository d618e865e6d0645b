"""What a session is set up with and what it shows, shared by the Chromium session
(``envs/gui/session.py``) and the drawn one (``envs/gui/drawn.py``); no browser needed."""

from __future__ import annotations

from dataclasses import dataclass

from envs.gui.tree import Node, render


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionConfig:
    """How a session's browser context is set up."""

    viewport: tuple[int, int] = (800, 600)  # CSS pixels
    device_scale: float = 1.0  # screenshot pixels per CSS pixel
    action_timeout_s: float = 2.0
    page_load_timeout_s: float = 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PageView:
    """What the agent sees after an action."""

    url: str
    title: str
    nodes: list[Node]
    png: bytes  # the viewport, viewport * device_scale pixels

    @property
    def tree(self) -> str:
        return render(self.nodes)
