"""Drive any Env: every assistant message is an action, every observation goes back in.

    env.reset -> [ctx.act() -> env.step(assistant message) -> observation messages]* -> done

The env owns the world, including any tool calls in the message (it runs them and returns
tool messages as its observation). A reply whose tool calls could not be parsed is *not*
sent to the env: ``ctx.act`` gives the model the parser's error observation instead (counted
in ``parse_errors``) and the loop tries again, so the env only ever sees well-formed actions.
Parsing only happens when the env shows tools to the model; plain text envs get the text as
is.
"""

from __future__ import annotations

from agentrl.agent import AgentLoop, RolloutContext
from agentrl.types import Sample


class EnvAgentLoop(AgentLoop):
    """Generic multi-turn loop: generate -> env.step -> observation, until the env is done."""

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        await ctx.reset()
        while True:
            reply = await ctx.act()
            if reply.ok and (await ctx.step(reply.message)).done:
                return
