"""RolloutContext hooks: a loop's ``context_class`` is what the collector builds, an override of
one hook changes the rollout, and the built-in loops handle parse errors through one path."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from agentrl.agent import (
    AGENTS,
    AgentLoop,
    ObservationSource,
    RolloutContext,
    RolloutStop,
    register_agent,
)
from agentrl.chat import ChatTemplate
from agentrl.env import ENVS, Env, register_env
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.tool import ToolSet
from agentrl.types import Message, RolloutStatus, Sample, ToolCall, Trajectory, user
from agents.env_driver import EnvAgentLoop
from agents.tool_calling import ToolAgentLoop

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'
BAD = '<tool_call>{"name": "calculator", "arguments": </tool_call>'
READ = '<tool_call>{"name": "read_log", "arguments": {}}</tool_call>'
LONG_LOG = "".join(f"line {i}: ok\n" for i in range(100))
KEEP = 40


def read_log() -> str:
    """Read the service log."""
    return LONG_LOG


class LogEnv(Env):
    """Asks how many lines the log has; any answer with '100' is right."""

    tools = ToolSet([read_log])

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return [user("How many lines does the service log have?")], {}

    async def astep(self, action: Message) -> Any:
        return [], float("100" in action.text), True, False, {}


class TruncatingContext(RolloutContext):
    """Shows the model only the first KEEP characters of each tool output."""

    def observe(self, messages: list[Message], source: ObservationSource) -> list[Message]:
        if source == "tools":
            messages = [
                dataclasses.replace(m, content=m.text[:KEEP] + "...[truncated]") for m in messages
            ]
        return super().observe(messages, source)


class TruncatingLoop(ToolAgentLoop):
    context_class = TruncatingContext


class TextActionsContext(RolloutContext):
    """Actions written as ``CALC: <expression>`` instead of the tool parser's format."""

    def parse_actions(self, text: str, finish_reason: str) -> tuple[Message, list[str]]:
        m = re.fullmatch(r"CALC: (.+)", text.strip())
        if m is None:
            return super().parse_actions(text, finish_reason)
        call = ToolCall(name="calculator", arguments={"expression": m.group(1)}, id="c0")
        return Message(role="assistant", content="", tool_calls=(call,)), []


class TextActionsLoop(ToolAgentLoop):
    context_class = TextActionsContext


class TokenBudgetContext(RolloutContext):
    """Ends the rollout once the conversation's ledger holds more than 60 tokens."""

    def should_stop(self) -> RolloutStop | None:
        if self.ledger.total_tokens > 60:
            return RolloutStop(RolloutStatus.TRUNCATED_LENGTH, "token budget spent")
        return super().should_stop()


class TokenBudgetLoop(EnvAgentLoop):
    context_class = TokenBudgetContext


class ParseErrorLog(RolloutContext):
    """Records the parse-error observations the loop shows and every add_parse_errors call."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observed: list[ObservationSource] = []
        self.add_calls = 0

    def observe(self, messages: list[Message], source: ObservationSource) -> list[Message]:
        self.observed.append(source)
        return super().observe(messages, source)

    def add_parse_errors(self, errors: list[str]) -> Message:
        self.add_calls += 1
        return super().add_parse_errors(errors)

    def trajectory(self, status: RolloutStatus | None = None, error: str | None = None) -> Any:
        traj = super().trajectory(status, error)
        traj.metrics["observed_parse_errors"] = float(self.observed.count("parse_errors"))
        traj.metrics["add_parse_errors_calls"] = float(self.add_calls)
        return traj


class ToolLoopWithLog(ToolAgentLoop):
    context_class = ParseErrorLog


class EnvLoopWithLog(EnvAgentLoop):
    context_class = ParseErrorLog


AGENT_LOOPS: dict[str, type[AgentLoop]] = {
    "test-hooks/truncating": TruncatingLoop,
    "test-hooks/text-actions": TextActionsLoop,
    "test-hooks/token-budget": TokenBudgetLoop,
    "test-hooks/tool-log": ToolLoopWithLog,
    "test-hooks/env-log": EnvLoopWithLog,
}


@pytest.fixture(scope="module", autouse=True)
def _registered() -> Any:
    register_env("test-hooks/Log-v0", LogEnv)
    for name, cls in AGENT_LOOPS.items():
        register_agent(name, cls, override=True)
    yield
    ENVS.unregister("test-hooks/Log-v0")
    for name in AGENT_LOOPS:
        AGENTS.unregister(name)


async def run_one(template: ChatTemplate, gen: Any, sample: Sample, **cfg: Any) -> Trajectory:
    config = CollectorConfig(group_size=1, check_ledger=True, **cfg)
    [group] = await RolloutCollector(config, gen, template).collect([sample])
    return group.trajectories[0]


def scripted(template: ChatTemplate, responses: list[str]) -> tuple[ScriptedGenerator, list[str]]:
    """A generator answering ``responses[turn]`` that records every prompt it was sent."""
    prompts: list[str] = []

    def respond(prompt: str, turn: int) -> str:
        prompts.append(prompt)
        return responses[min(turn, len(responses) - 1)]

    return ScriptedGenerator(template, respond), prompts


def test_the_default_context_class_is_rollout_context() -> None:
    assert AgentLoop.context_class is RolloutContext
    assert ToolAgentLoop.context_class is RolloutContext
    assert TruncatingLoop.context_class is TruncatingContext


async def test_an_observe_override_truncates_tool_outputs_in_a_collected_rollout(chatml) -> None:  # type: ignore[no-untyped-def]
    sample = Sample(env_id="test-hooks/Log-v0")
    answers = [READ, "The log has 100 lines."]
    gen, prompts = scripted(chatml, answers)
    plain = await run_one(chatml, gen, sample, agent="tool_calling")
    gen, truncated_prompts = scripted(chatml, answers)
    traj = await run_one(chatml, gen, sample, agent="test-hooks/truncating")

    for t in (plain, traj):
        assert t.status is RolloutStatus.COMPLETED and t.reward == 1.0, t.error
        assert [m.role for m in t.messages] == ["user", "assistant", "tool", "assistant"]
        assert t.metrics["ledger_mismatch"] == 0.0 and t.metrics["tool_calls"] == 1.0
    assert plain.messages[2].text == LONG_LOG
    assert traj.messages[2].text == LONG_LOG[:KEEP] + "...[truncated]"
    # the model saw the truncated output: the second prompt is shorter and holds no line 99
    assert "line 99: ok" in prompts[1] and "line 99: ok" not in truncated_prompts[1]
    assert "...[truncated]" in truncated_prompts[1]
    assert traj.turns[1].prompt_len < plain.turns[1].prompt_len
    assert "line 99" not in chatml.decode(traj.segments[0].token_ids)


async def test_a_parse_actions_override_reads_a_custom_action_format(chatml) -> None:  # type: ignore[no-untyped-def]
    sample = Sample(env_id="test-agents/Calc-v0")
    answers = ["CALC: 12 * 7", "The answer is 84."]
    plain = await run_one(chatml, ScriptedGenerator(chatml, answers), sample, agent="tool_calling")
    # the default parser sees no tool call: the first reply is the (wrong) answer
    assert plain.reward == 0.0 and plain.num_turns == 1 and plain.metrics["tool_calls"] == 0.0

    traj = await run_one(
        chatml, ScriptedGenerator(chatml, answers), sample, agent="test-hooks/text-actions"
    )
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0, traj.error
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[2].tool_calls[0].arguments == {"expression": "12 * 7"}
    assert traj.messages[3].text == "84" and traj.metrics["tool_calls"] == 1.0
    assert traj.metrics["ledger_mismatch"] == 0.0


async def test_a_should_stop_override_ends_the_rollout_with_its_status(chatml) -> None:  # type: ignore[no-untyped-def]
    sample = Sample(env_id="test-agents/Guess-v0", seed=9)
    plain = await run_one(chatml, ScriptedGenerator(chatml, ["1"]), sample, agent="env_driver")
    assert plain.status is RolloutStatus.TRUNCATED_MAX_TURNS and plain.num_turns == 8
    traj = await run_one(
        chatml, ScriptedGenerator(chatml, ["1"]), sample, agent="test-hooks/token-budget"
    )
    assert traj.status is RolloutStatus.TRUNCATED_LENGTH and traj.error is None
    assert 1 < traj.num_turns < 8
    assert len(traj.segments[0]) > 60 and traj.metrics["ledger_mismatch"] == 0.0


async def test_tool_calling_shows_tool_results_then_one_parse_error_observation(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, [CALL + "\n" + BAD, BAD, "The answer is 84."])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/Calc-v0"), agent="test-hooks/tool-log"
    )
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0, traj.error
    roles = [m.role for m in traj.messages]
    turn_0 = ["assistant", "tool", "user"]  # the good call's result, then the error observation
    assert roles == ["system", "user", *turn_0, "assistant", "user", "assistant"]
    assert traj.messages[3].text == "84"
    assert all("could not be parsed" in traj.messages[i].text for i in (4, 6))
    assert traj.metrics["parse_errors"] == 2.0
    assert traj.metrics["observed_parse_errors"] == 2.0
    assert traj.metrics["add_parse_errors_calls"] == 2.0
    assert traj.metrics["tool_calls"] == 1.0 and traj.num_turns == 3


@pytest.mark.parametrize(
    ("agent", "counted"),
    [("env_driver", False), ("test-hooks/env-log", True), ("tool_calling", False)],
)
async def test_built_in_loops_count_and_show_each_parse_error_once(chatml, agent, counted) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, [BAD, BAD + " " + BAD, "5"])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/ToolGuess-v0", seed=5), agent=agent
    )
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0, traj.error
    errors = [m for m in traj.messages if "could not be parsed" in m.text]
    assert len(errors) == 2 and traj.metrics["parse_errors"] == 3.0
    assert errors[1].text.count("\n- ") == 2  # both errors of the second reply, in one message
    if agent == "env_driver":  # the env saw only the well-formed guess
        assert [m.role for m in traj.messages][-2:] == ["assistant", "user"]
        assert traj.messages[-1].text == "Correct!"
    if counted:
        assert traj.metrics["observed_parse_errors"] == 2.0
        assert traj.metrics["add_parse_errors_calls"] == 2.0


async def test_single_turn_counts_parse_errors_without_showing_them(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, [BAD])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/ToolGuess-v0", seed=5), agent="single_turn"
    )
    assert traj.metrics["parse_errors"] == 1.0 and traj.num_turns == 1
    assert not any("could not be parsed" in m.text for m in traj.messages)
