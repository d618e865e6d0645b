"""A long-tailed multi-turn tool env for benchmarking asynchronous training (issue 23).

    bench/LongTail-v0   'Compute "7 * 4 * 3" with the calculator.'
                        -> calculator(expression="7 * 4 * 3")  -> tool: "running: call again"
                        -> ... (the job needs ``k`` calls, each waits ``latency_s``)
                        -> calculator(expression="7 * 4 * 3")  -> tool: "84"
                        -> assistant: "Answer: 84"             -> reward 1.0

The quickstart's calculator task (``arith/Calculator-v0``: the same prompt, the same reward),
except that the calculator is a slow job: every call waits ``latency_s`` (``asyncio.sleep``,
no CPU) and only the ``k``-th call returns the value; the calls before it return
``"running: call again"``. ``k`` (the tool calls, i.e. turns, a task needs) and ``latency_s``
(the wait per call) are drawn per task from the seeded ``np_random``, so the same seed gives
the same task, the same turns and the same waits, and group-mates share them. Both are
lognormal, given by their p50 and p90 (the p99 follows); ``k`` is rounded and clipped to
``[1, max_calls]``, ``latency_s`` multiplied by ``latency_scale``.

Defaults and where they come from: the repository holds no SWE rollout statistics to fit to
(``recipes/swe.yaml`` caps an episode at 4 turns and its tiny policy does not yet write tool
calls reliably, docs/guides/swe.md), so the shapes are chosen, not fitted: long-tailed like
agent trajectories on repositories (most tasks take a few turns, a few take many; most
commands return at once, a test run takes far longer), scaled down to the tiny model's
context. Turns: p50 3, p90 6 (p99 ~10.5, clipped at 12). Wait per call: p50 0.05 s, p90
0.2 s (p99 ~0.6 s). docs/guides/async.md states them next to the benchmark's figures.

A bad call gets a clear tool message (``Error: ValueError: invalid expression ...``; it waits
but does not advance the job); answering before the value came back earns 0.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agentrl.errors import ConfigError
from agentrl.tool import Injected, ToolSet, tool
from agentrl.types import Message, ToolCall
from envs.countdown import CalculatorEnv, _normalize, evaluate, format_number

RUNNING = "running: call again"
_Z90, _Z99 = 1.2815515655446004, 2.3263478740408408


def lognormal_sigma(p50: float, p90: float) -> float:
    """The sigma of a lognormal with these median and 90th percentile."""
    if not 0 < p50 <= p90:
        raise ConfigError(f"a lognormal needs 0 < p50 <= p90, got p50={p50}, p90={p90}")
    return math.log(p90 / p50) / _Z90


def lognormal_p99(p50: float, p90: float) -> float:
    return p50 * math.exp(_Z99 * lognormal_sigma(p50, p90))


@tool
async def calculator(expression: str, env: Injected[Any] = None) -> str:
    """Evaluate an arithmetic expression. A slow job: it may answer "running: call again".

    Args:
        expression: e.g. "(3 + 4) * 5".
    """
    if not isinstance(env, LongTailEnv):
        return format_number(evaluate(expression))
    await asyncio.sleep(env.latency_s)
    env.tool_wait_s += env.latency_s
    value = format_number(evaluate(expression))  # a bad expression does not advance the job
    env.calls += 1
    if env.calls < env.calls_needed:
        return RUNNING
    env.evaluated[_normalize(expression)] = value
    return value


SLOW_CALCULATOR_TOOLS = ToolSet([calculator], name="slow_calculator")


class LongTailEnv(CalculatorEnv):
    """Calculator task whose tool needs ``k`` calls of ``latency_s`` each, drawn per task.

    Args:
        digits, terms, ops, partial_credit: as ``arith/Calculator-v0``.
        turns_p50, turns_p90: lognormal tool calls per task (rounded, clipped to [1, max_calls]).
        max_calls: the most calls a task needs.
        latency_p50, latency_p90: lognormal seconds each call waits.
        latency_scale: multiplies every wait (0: no waiting, for tests).
        max_turns: steps before truncation (default max_calls + 2).
    """

    tools = SLOW_CALCULATOR_TOOLS

    def __init__(
        self,
        *,
        digits: int = 1,
        terms: int = 3,
        ops: tuple[str, ...] | list[str] = ("*",),
        partial_credit: float = 0.2,
        turns_p50: float = 3.0,
        turns_p90: float = 6.0,
        max_calls: int = 12,
        latency_p50: float = 0.05,
        latency_p90: float = 0.2,
        latency_scale: float = 1.0,
        max_turns: int | None = None,
    ) -> None:
        if max_calls < 1 or latency_scale < 0:
            raise ConfigError(
                f"LongTailEnv needs max_calls >= 1 and latency_scale >= 0; got {max_calls}, "
                f"{latency_scale}"
            )
        max_turns = max_calls + 2 if max_turns is None else max_turns
        if max_turns < max_calls + 1:
            raise ConfigError(
                f"max_turns ({max_turns}) must be >= max_calls + 1 ({max_calls + 1}): the "
                "longest task needs max_calls tool calls and an answer"
            )
        super().__init__(
            digits=digits, terms=terms, ops=ops, partial_credit=partial_credit, max_turns=max_turns
        )
        self.turns_mu, self.turns_sigma = math.log(turns_p50), lognormal_sigma(turns_p50, turns_p90)
        self.lat_mu, self.lat_sigma = (
            math.log(latency_p50),
            lognormal_sigma(latency_p50, latency_p90),
        )
        self.max_calls, self.latency_scale = max_calls, latency_scale
        self.calls_needed, self.latency_s = 1, 0.0
        self.calls, self.tool_wait_s = 0, 0.0

    def draw_task_shape(self) -> tuple[int, float]:
        """(calls needed, seconds per call) from ``np_random``: after the expression's draws."""
        k = self.np_random.lognormal(self.turns_mu, self.turns_sigma)
        lat = self.np_random.lognormal(self.lat_mu, self.lat_sigma)
        return min(self.max_calls, max(1, round(float(k)))), float(lat) * self.latency_scale

    def _new_task(self) -> None:
        super()._new_task()
        self.calls_needed, self.latency_s = self.draw_task_shape()
        self.calls, self.tool_wait_s = 0, 0.0

    def demonstration(self) -> list[Message] | None:
        if not self.expression:
            return None
        out: list[Message] = []
        for i in range(self.calls_needed):
            call = ToolCall(
                name="calculator", arguments={"expression": self.expression}, id=f"call_{i}"
            )
            last = i == self.calls_needed - 1
            out += [
                Message(role="assistant", content="", tool_calls=(call,)),
                Message(
                    role="tool",
                    content=self.value if last else RUNNING,
                    tool_call_id=call.id,
                    name="calculator",
                ),
            ]
        return [*out, Message(role="assistant", content=f"Answer: {self.value}")]
