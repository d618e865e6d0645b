"""One prompt, one completion: reset the env, generate once, score the answer with env.step.

env.reset -> observation messages -> generate -> env.step(answer) -> reward
"""

from __future__ import annotations

from agentrl.agent import AgentLoop, RolloutContext
from agentrl.types import Sample


class SingleTurnAgentLoop(AgentLoop):
    """Math, QA and other tasks answered in one turn. Ignores any tool calls in the answer.

    Parse errors are counted (``parse_errors``) but not shown: there is no turn after it.
    """

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        await ctx.reset()
        reply = await ctx.generate()
        await ctx.step(reply.message)
