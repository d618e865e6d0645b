"""GUIAgentLoop: operate a web page (``gui/Browser-v0``) from its element tree, with a history
window.

    reset -> [generate action -> env.step(reply): the browser acts -> new page]* -> reward

Every assistant reply is one browser action (``click(7)``, ``type(4, "mira")``, ...); the env
parses it, acts and answers with the page (URL, title, element tree). What this loop adds, in
``GUIContext``:

- text mode: image parts of observations (screenshots, when the env sends them) are dropped,
  so a text-only model sees the element tree alone;
- ``history_window`` (k, 0: off): only the last k observations keep their page; older ones are
  cut to their first lines (the action, its result, the URL and title: ``Page: [elided]``),
  so the context stays bounded on long episodes while the model still sees what it did. Like
  the SWE loop's window, cuts happen in batches (each time k more observations have aged out),
  and each starts a new training segment, since the earlier prompt is no longer a prefix.

Not built yet: a vision mode (screenshots to a vision-language model) needs images in the
token ledger and ``TrainBatch``; see docs/guides/gui.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.agent import AgentLoop, ObservationSource, RolloutContext
from agentrl.errors import ConfigError
from agentrl.types import Message, Sample

PAGE = "\nPage:\n"
ELIDED = "\nPage: [elided]"


class GUIContext(RolloutContext):
    """A RolloutContext that shows pages as text and keeps only the last k of them."""

    history_window: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics["compactions"] = 0.0

    def observe(self, messages: list[Message], source: ObservationSource) -> list[Message]:
        """Text mode: keep the text parts of each observation, drop images."""
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
        pages = [i for i, m in enumerate(self.messages) if m.role == "user" and PAGE in m.text]
        aged = pages[: -self.history_window]
        if len(aged) < self.history_window:
            return 0
        for i in aged:
            m = self.messages[i]
            self.messages[i] = dataclasses.replace(m, content=m.text.split(PAGE, 1)[0] + ELIDED)
        self.new_segment()
        self.metrics["compactions"] += 1
        return len(aged)


class GUIAgentLoop(AgentLoop):
    """Browser tasks in text mode: one action per reply until the env ends the episode."""

    context_class = GUIContext

    def __init__(self, history_window: int = 3, mode: str = "text") -> None:
        if history_window < 0:
            raise ConfigError(
                f"gui agent: history_window must be >= 0 (0: off), got {history_window}"
            )
        if mode != "text":
            raise ConfigError(
                f"gui agent: mode {mode!r} is not built yet; only mode='text' (the element tree) "
                "exists (a vision mode needs images in the ledger; see docs/guides/gui.md)"
            )
        self.history_window = history_window

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        if isinstance(ctx, GUIContext):
            ctx.history_window = self.history_window
        await ctx.reset()
        while True:
            reply = await ctx.act()
            if reply.ok and (await ctx.step(reply.message)).done:
                return
