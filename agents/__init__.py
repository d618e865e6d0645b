"""Built-in AgentLoops, registered lazily (nothing is imported until a loop is made).

    single_turn   reset -> one generate -> env.step                  (math / QA tasks)
    tool_calling  ReAct: generate -> run tool calls with the env's ToolSet -> repeat;
                  a reply without tool calls goes to env.step (the answer)
    env_driver    reset -> generate -> env.step(assistant message) -> observation -> ...;
                  the env handles tool calls itself
    gui           browser tasks (gui/Browser-v0) in text mode: one action per reply, the
                  element tree as the observation, a history window of the last k pages
    gateway       a black-box agent (a callable or a command) that speaks OpenAI Chat
                  Completions to a per-trajectory gateway; options in rollout.agent_options
    swe           env_driver for repository tasks (swe/Repo-v0): a history window, a
                  wall-time budget, and a grade of the workspace when a limit ends it

A dataset row picks one with ``Sample.agent``; the collector's ``agent`` is the default.
"""

from agentrl.agent import register_agent

register_agent(
    "single_turn",
    "agents.single_turn:SingleTurnAgentLoop",
    description="One completion per episode, scored by env.step.",
)
register_agent(
    "tool_calling",
    "agents.tool_calling:ToolAgentLoop",
    description="ReAct over the env's ToolSet; the final answer goes to env.step.",
)
register_agent(
    "env_driver",
    "agents.env_driver:EnvAgentLoop",
    description="Drives any Env: every assistant message is an env action.",
)
register_agent(
    "swe",
    "agents.swe_agent:SWEAgentLoop",
    description="Repository tasks: act until submit or a limit, then grade the workspace.",
)
register_agent(
    "gateway",
    "agents.gateway_agent:GatewayAgentLoop",
    description="A black-box OpenAI-speaking agent (rollout.agent_options: agent or command).",
)
register_agent(
    "gui",
    "agents.gui_agent:GUIAgentLoop",
    description="Browser tasks (gui/Browser-v0) from the element tree; history_window=k pages.",
)
