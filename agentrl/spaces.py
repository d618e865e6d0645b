"""Gymnasium spaces for chat: observations are lists of messages, actions are one message.

    env.observation_space = MessagesSpace.observations()   # list[Message], any non-assistant role
    env.action_space = MessagesSpace.actions(tool_names=("calculator",))  # one assistant Message

Gymnasium's spaces are arrays, discrete values and containers of those; none describes a
list of chat messages, so ``MessagesSpace`` is our own ``gymnasium.spaces.Space``. It makes
``gymnasium.utils.env_checker.check_env`` run on every agentrl env: ``contains`` checks the
shape of the data and ``sample`` draws seeded random messages (short text from a small
vocabulary and, for actions, sometimes tool calls to the env's tools with random arguments).
Sampled tool calls carry ids drawn from the space's RNG, so a seeded sample is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from agentrl.types import Message, ToolCall

_ROLES = ("system", "user", "assistant", "tool")
_WORDS = (
    "the",
    "answer",
    "is",
    "42",
    "7",
    "-3",
    "yes",
    "no",
    "hello",
    "Answer:",
    "<answer>1</answer>",
    "+",
    "*",
    "(",
    ")",
    "up",
    "left",
)


class MessagesSpace(gym.spaces.Space[Any]):
    """The space of one assistant message (``kind="action"``) or a list of messages
    (``kind="observation"``).

    Args:
        kind: ``"observation"`` (a ``list[Message]``) or ``"action"`` (a ``Message``).
        roles: roles allowed in the messages; defaults: every role but ``assistant`` for
            observations, ``assistant`` for actions.
        max_messages: the longest observation list ``contains`` accepts.
        tool_names: tool names ``sample`` may call (actions only); empty: text only.
        seed: seeds the sampling RNG (``space.seed(s)`` does the same later).
    """

    def __init__(
        self,
        kind: str = "observation",
        *,
        roles: Sequence[str] | None = None,
        max_messages: int = 1024,
        tool_names: Sequence[str] = (),
        seed: int | None = None,
    ) -> None:
        if kind not in ("observation", "action"):
            raise ValueError(f"MessagesSpace kind must be 'observation' or 'action', got {kind!r}")
        super().__init__(shape=None, dtype=None, seed=seed)
        self.kind = kind
        default_roles = ("assistant",) if kind == "action" else ("system", "user", "tool")
        self.roles = tuple(roles) if roles is not None else default_roles
        bad = [r for r in self.roles if r not in _ROLES]
        if bad:
            raise ValueError(f"unknown roles {bad}; expected a subset of {_ROLES}")
        self.max_messages = max_messages
        self.tool_names = tuple(tool_names)

    @classmethod
    def observations(cls, **kwargs: Any) -> MessagesSpace:
        """The space of an env's observations: a list of non-assistant messages."""
        return cls("observation", **kwargs)

    @classmethod
    def actions(cls, *, tool_names: Sequence[str] = (), **kwargs: Any) -> MessagesSpace:
        """The space of an env's actions: one assistant message, maybe with tool calls."""
        return cls("action", tool_names=tool_names, **kwargs)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    # --- membership -----------------------------------------------------------------------
    def contains(self, x: Any) -> bool:
        if self.kind == "action":
            return self._message_ok(x)
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        return all(self._message_ok(m) for m in x)

    def _message_ok(self, m: Any) -> bool:
        if not isinstance(m, Message) or m.role not in self.roles:
            return False
        if isinstance(m.content, list):
            if not all(isinstance(p, dict) and "type" in p for p in m.content):
                return False
        elif not isinstance(m.content, str):
            return False
        if m.role == "tool" and not m.tool_call_id:
            return False
        return all(
            isinstance(tc, ToolCall) and isinstance(tc.name, str) and isinstance(tc.arguments, dict)
            for tc in m.tool_calls
        )

    # --- sampling -------------------------------------------------------------------------
    def sample(self, mask: Any | None = None, probability: Any | None = None) -> Any:
        """A random member: seeded by ``space.seed(s)``; ``mask``/``probability`` unsupported."""
        if mask is not None or probability is not None:
            raise ValueError("MessagesSpace.sample does not support mask or probability")
        if self.kind == "action":
            return self._sample_action()
        n = int(self.np_random.integers(1, 3))
        roles = [r for r in self.roles if r != "tool"] or ["user"]
        return [
            Message(role=roles[int(self.np_random.integers(len(roles)))], content=self._text())  # type: ignore[arg-type]
            for _ in range(n)
        ]

    def _text(self) -> str:
        n = int(self.np_random.integers(1, 6))
        return " ".join(_WORDS[int(i)] for i in self.np_random.integers(len(_WORDS), size=n))

    def _sample_action(self) -> Message:
        text = self._text()
        if not self.tool_names or self.np_random.random() < 0.5:
            return Message(role="assistant", content=text)
        name = self.tool_names[int(self.np_random.integers(len(self.tool_names)))]
        call_id = f"call_{int(self.np_random.integers(2**31)):08x}"
        args = {"input": self._text()}
        return Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall(name=name, arguments=args, id=call_id),),
        )

    def __repr__(self) -> str:
        extra = f", tool_names={list(self.tool_names)}" if self.tool_names else ""
        return f"MessagesSpace({self.kind!r}, roles={list(self.roles)}{extra})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MessagesSpace)
            and other.kind == self.kind
            and other.roles == self.roles
            and other.tool_names == self.tool_names
            and other.max_messages == self.max_messages
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.roles, self.tool_names, self.max_messages))
