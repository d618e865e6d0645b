"""Per-sandbox state that tools keep between calls (bash session, edit history, submission).

Tools are module-level functions; the sandbox they act on is injected at call time. Their
state hangs off that sandbox in a weak map, so it disappears with the sandbox.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentrl.sandbox import Sandbox

if TYPE_CHECKING:
    from tools.bash import BashSession

MAX_OUTPUT_CHARS = 20_000
"""Longest tool output the model sees; the middle of longer outputs is cut out."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """What the agent submitted: its final answer and the workspace's diff (git repos only)."""

    answer: str
    diff: str


@dataclass(slots=True)
class ToolState:
    bash: BashSession | None = None
    history: dict[str, list[bytes | None]] = field(default_factory=dict)  # path -> old contents
    submission: Submission | None = None


_states: weakref.WeakKeyDictionary[Sandbox, ToolState] = weakref.WeakKeyDictionary()


def state_of(sandbox: Sandbox) -> ToolState:
    st = _states.get(sandbox)
    if st is None:
        st = _states[sandbox] = ToolState()
    return st


def get_submission(sandbox: Sandbox) -> Submission | None:
    """The agent's submission in ``sandbox``, or None if it has not submitted."""
    st = _states.get(sandbox)
    return st.submission if st else None


def clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text`` with its middle replaced by a marker when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 3 // 4], text[-(limit // 4) :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters truncated ...]\n{tail}"
