"""ReAct over the env's tools: generate, run the tool calls, show the results, repeat.

    env.reset -> [ctx.act(tools=True): generate -> tool messages]* -> env.step(answer)

``ctx.act(tools=True)`` runs the calls with ``ctx.tools`` (the env's ``ToolSet``); the loop
hands the env only replies without tool calls (the answer). If the env does not terminate,
its observation is added and the loop goes on. A reply whose tool calls could not be parsed
gets the parser's error observation (counted in ``parse_errors``) after the results of the
calls that did parse; the env is not stepped for it. Turn and context limits end the loop
(see ``RolloutContext``).
"""

from __future__ import annotations

from agentrl.agent import AgentLoop, RolloutContext
from agentrl.types import Sample


class ToolAgentLoop(AgentLoop):
    """Tool-calling agent: the model calls tools until it answers; the env scores the answer."""

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        await ctx.reset()
        while True:
            reply = await ctx.act(tools=True)
            if reply.ok and not reply.tool_calls and (await ctx.step(reply.message)).done:
                return
