"""SWEAgentLoop: work on a repository task until submit or a limit, then always grade.

    reset -> [generate -> env.step(reply): tools or a bash block run in the sandbox]* -> grade

The env (``swe/Repo-v0``) runs the actions and grades on submit. What this loop adds is
context management for long episodes, in ``SWEContext`` (chosen through ``context_class``):

- ``history_window`` (0: off): observations older than the last ``history_window`` are
  replaced by a one-line marker. Compaction happens in batches (each time ``history_window``
  more observations have aged out), and each one starts a new training segment, since the
  earlier prompt is no longer a prefix of the new one.
- ``wall_time_s`` (0: off): a budget for the whole rollout, checked before each turn; the
  rollout ends as ``truncated_time``.
- the turn and token limits of every loop (``rollout.max_turns``, ``rollout.max_tokens``).

When a limit ends the episode, the workspace is graded as it is (a fix made before the limit
still counts), and the rollout keeps its truncated status. A reply that fails to parse gets
the parser's error observation and does not reach the env.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from agentrl.agent import AgentLoop, RolloutContext, RolloutStop
from agentrl.errors import ConfigError
from agentrl.types import Message, RolloutStatus, Sample

GRADE_NOW = Message(role="user", content="[limit reached: the workspace is graded as it is]")
"""The action that asks ``swe/Repo-v0`` for a grade (a non-assistant action ends its episode)."""
ELIDED = "[output elided to save context: {n} characters; run the command again to see it]"


class SWEContext(RolloutContext):
    """A RolloutContext with a history window and a wall-time budget (see the module doc)."""

    history_window: int = 0
    wall_time_s: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._started = time.monotonic()
        self.metrics["compactions"] = 0.0

    def should_stop(self) -> RolloutStop | None:
        """The turn limit, then the wall-time budget."""
        stop = super().should_stop()
        if stop is None and self.wall_time_s > 0:
            spent = time.monotonic() - self._started
            if spent > self.wall_time_s:
                return RolloutStop(
                    RolloutStatus.TRUNCATED_TIME,
                    f"wall time {spent:.0f} s over wall_time_s={self.wall_time_s:g}",
                )
        return stop

    def build_prompt(self, prompt_ids: list[int] | None = None) -> list[int] | None:
        """Compact old observations (a new segment) before rendering, when the window is full."""
        if self.history_window > 0:
            self.compact()
        return super().build_prompt(prompt_ids)

    def compact(self) -> int:
        """Elide observations older than the window once ``history_window`` (> 0) aged out."""
        first_user = next((i for i, m in enumerate(self.messages) if m.role == "user"), -1)
        observations = [
            i
            for i, m in enumerate(self.messages)
            if i > first_user
            and m.role in ("tool", "user")
            and not m.text.startswith("[output elided")
        ]
        aged = observations[: -self.history_window]
        if len(aged) < self.history_window:
            return 0
        for i in aged:
            m = self.messages[i]
            self.messages[i] = dataclasses.replace(m, content=ELIDED.format(n=len(m.text)))
        self.new_segment()
        self.metrics["compactions"] += 1
        return len(aged)


class SWEAgentLoop(AgentLoop):
    """Repository tasks: act until the env grades a submission or a limit asks for a grade."""

    context_class = SWEContext

    def __init__(self, history_window: int = 0, wall_time_s: float = 0.0) -> None:
        if history_window < 0 or wall_time_s < 0:
            raise ConfigError(
                f"swe agent: history_window ({history_window}) and wall_time_s ({wall_time_s}) "
                "must be >= 0 (0 turns the limit off)"
            )
        self.history_window = history_window
        self.wall_time_s = wall_time_s

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        if isinstance(ctx, SWEContext):
            ctx.history_window, ctx.wall_time_s = self.history_window, self.wall_time_s
        await ctx.reset()
        try:
            while True:
                stop = ctx.should_stop()
                if stop is not None:
                    raise stop
                reply = await ctx.act()
                if reply.ok and (await ctx.step(reply.message)).done:
                    return
        except RolloutStop:
            await ctx.step(GRADE_NOW)  # what the workspace holds at the limit still counts
            raise
