"""GUIAgentLoop: operate a web page (``gui/Browser-v0``) from its element tree, with a history
window.

    reset -> [generate action -> env.step(reply): the browser acts -> new page]* -> reward

Every assistant reply is one browser action (``click(7)``, ``type(4, "mira")``, ...); the env
parses it, acts and answers with the page (URL, title, element tree). What this loop adds, in
``GUIContext``:

- ``mode="text"``: image parts of observations (screenshots, when the env sends them) are
  dropped, so a text-only model sees the element tree alone;
- ``mode="vision"``: observations keep their screenshots, for a vision-language model
  (``agentrl.vision``; the env's ``observe="screenshot"`` or ``"both"``); each image travels
  through the token ledger to the server and the trainer as its data URL;
- ``history_window`` (k, 0: off): only the last k observations keep their page (tree and
  screenshot); older ones are cut to their first lines (the action, its result, the URL and
  title: ``Page: [elided]``), so the context stays bounded on long episodes while the model
  still sees what it did. Like
  the SWE loop's window, cuts happen in batches (each time k more observations have aged out),
  and each starts a new training segment, since the earlier prompt is no longer a prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from agentrl.agent import AgentLoop, ObservationSource, RolloutContext
from agentrl.errors import ConfigError
from agentrl.types import Message, Sample

PAGE = "\nPage:\n"
ELIDED = "\nPage: [elided]"
Mode = Literal["text", "vision"]


class GUIContext(RolloutContext):
    """A RolloutContext that shows pages (as text, or with their screenshots) and keeps only
    the last k of them."""

    history_window: int = 0
    mode: Mode = "text"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics["compactions"] = 0.0

    def observe(self, messages: list[Message], source: ObservationSource) -> list[Message]:
        """Text mode: keep the text parts of each observation, drop images; vision: keep all."""
        if self.mode == "vision":
            return super().observe(messages, source)
        text = [
            m if isinstance(m.content, str) else dataclasses.replace(m, content=m.text)
            for m in messages
        ]
        return super().observe(text, source)

    def build_prompt(self, prompt_ids: list[int] | None = None) -> list[int] | None:
        if self.history_window > 0:
            self.compact()
        return super().build_prompt(prompt_ids)

    def compact(self) -> int:
        """Cut the pages of observations older than the window, once ``history_window`` aged out."""
        pages = [i for i, m in enumerate(self.messages) if m.role == "user" and _is_page(m)]
        aged = pages[: -self.history_window]
        if len(aged) < self.history_window:
            return 0
        for i in aged:
            m = self.messages[i]
            self.messages[i] = dataclasses.replace(m, content=m.text.split(PAGE, 1)[0] + ELIDED)
        self.new_segment()
        self.metrics["compactions"] += 1
        return len(aged)


def _is_page(m: Message) -> bool:
    """An observation that still shows a page: its element tree or a screenshot."""
    if PAGE in m.text:
        return True
    return isinstance(m.content, list) and any(p.get("type") != "text" for p in m.content)


class GUIAgentLoop(AgentLoop):
    """Browser tasks: one action per reply until the env ends the episode."""

    context_class = GUIContext

    def __init__(self, history_window: int = 3, mode: Mode = "text") -> None:
        if history_window < 0:
            raise ConfigError(
                f"gui agent: history_window must be >= 0 (0: off), got {history_window}"
            )
        if mode not in ("text", "vision"):
            raise ConfigError(
                f"gui agent: mode must be 'text' (the element tree, any model) or 'vision' "
                f"(screenshots too, a vision-language model), got {mode!r}"
            )
        self.history_window, self.mode = history_window, mode

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        if isinstance(ctx, GUIContext):
            ctx.history_window, ctx.mode = self.history_window, self.mode
        await ctx.reset()
        while True:
            reply = await ctx.act()
            if reply.ok and (await ctx.step(reply.message)).done:
                return
