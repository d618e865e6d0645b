"""Arithmetic with a calculator tool: the reward requires using the tool, and using it right.

    arith/Calculator-v0   'Compute "37 * 48" with the calculator.'
                          -> assistant: calculator(expression="37 * 48")  -> tool: "1776"
                          -> assistant: "Answer: 1776"                    -> reward 1.0
    arith/Countdown-v0    "Use 3, 7, 25 to reach 81 with the calculator."
                          -> calculator(expression="25 * 3 + 7 - 1") ... -> "Answer: 25 * 3 + 7 - 1"

Each step is either tool calls (run with ``self.tools``; the tool messages are the
observation, reward 0) or a final answer (ends the episode with the reward). The calculator
records what it computed into the env it is given (``env=``, injected by ``Env.acall_tools``
and by AgentLoops that run tools themselves), so the reward works either way. Rewards:

- Calculator: 1.0 if the answer equals the true value *and* the calculator returned that value
  in this episode; ``partial_credit`` if the calculator returned the true value but the final
  answer is wrong; 0 otherwise (a correct answer without the tool earns nothing).
- Countdown: 1.0 if the answer is an expression over the given numbers (each at most once)
  whose value is the target and the calculator evaluated that same expression;
  ``unverified_credit`` if it is right but was never checked with the calculator.

The episode is truncated after ``max_turns`` steps without an answer. Tasks are built from
``self.np_random``: the numbers for Countdown come from a random expression, so every task
is solvable and ``demonstration()`` replays that expression.

Prompts are short and the Calculator prompt quotes the expression exactly as the tool call
writes it, so the first turn is a copy. Measured: a 1.09M-parameter tiny model (hidden 128,
4 layers, ``agentrl.tiny``) trained on Calculator-v0 demonstrations alone (batch 16, AdamW
lr 1e-3) made the exact tool call and the exact answer on 100 of 100 held-out seeds after
500 steps, for 1- and 2-digit operands; with lr 3e-3 it plateaued. With one-digit operands
(the quickstart recipe) a 600k-parameter model (hidden 128, 2 layers) learns the copy after
~100-200 SFT steps at lr 3e-3, and an episode is ~120 tokens with the tiny chat template.
"""

from __future__ import annotations

import ast
import operator
import re
import warnings
from typing import Any

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.reward import extract_answer
from agentrl.tool import Injected, ToolSet, tool
from agentrl.types import Message, ToolCall

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(expression: str) -> int | float:
    """Evaluate +, -, *, /, //, % and parentheses over numbers; ValueError otherwise."""
    try:
        with warnings.catch_warnings():
            # Model text such as "2and 3" makes the tokenizer warn ("invalid decimal literal")
            # on stderr; it is just an invalid expression here.
            warnings.simplefilter("error", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, SyntaxWarning) as e:
        raise ValueError(f"invalid expression {expression!r}") from e

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value  # type: ignore[return-value]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
                raise ValueError("division by zero")
            if abs(left) > 1e12 or abs(right) > 1e12:
                raise ValueError("number too large")
            return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
        raise ValueError(f"unsupported syntax in {expression!r}; use numbers, + - * / and ( )")

    return ev(tree.body)


def format_number(v: int | float) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v) if isinstance(v, int) else f"{v:.6g}"


@tool
def calculator(expression: str, env: Injected[Any] = None) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "(3 + 4) * 5".
    """
    value = format_number(evaluate(expression))
    if isinstance(env, _ToolArithmeticEnv):  # the env scores answers against what it computed
        env.evaluated[_normalize(expression)] = value
    return value


CALCULATOR_TOOLS = ToolSet([calculator], name="calculator")


class _ToolArithmeticEnv(Env):
    """Shared loop: tool calls -> tool messages; a text answer -> the reward."""

    tools = CALCULATOR_TOOLS

    def __init__(self, *, max_turns: int = 4) -> None:
        if max_turns < 2:
            raise ConfigError(
                f"max_turns must be >= 2 (one tool call + one answer), got {max_turns}"
            )
        self.max_turns = max_turns
        self.turns = 0
        self.evaluated: dict[str, str] = {}  # normalized expression -> calculator output

    def _prompt(self) -> str:
        raise NotImplementedError

    def _new_task(self) -> None:
        raise NotImplementedError

    def _score(self, answer: str | None) -> tuple[float, Info]:
        raise NotImplementedError

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        await super().areset(seed=seed)
        self._new_task()
        self.turns, self.evaluated = 0, {}
        return [Message(role="user", content=self._prompt())], {}

    async def astep(self, action: Message) -> StepResult:
        self.turns += 1
        if action.tool_calls:
            obs = await self.acall_tools(action)  # the calculator records into self.evaluated
            truncated = self.turns >= self.max_turns
            return obs, 0.0, False, truncated, {"tool_calls": len(action.tool_calls)}
        reward, info = self._score(extract_answer(action.text))
        return [], reward, True, False, info


def _normalize(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


class CalculatorEnv(_ToolArithmeticEnv):
    """Compute ``a op b`` (or more terms) with the calculator, then answer.

    Args:
        digits: digits per operand (2: 10..99).
        terms: operands per task.
        ops: operators to draw from.
        partial_credit: reward when the calculator gave the right value but the answer is wrong.
        max_turns: steps before truncation.
    """

    def __init__(
        self,
        *,
        digits: int = 2,
        terms: int = 2,
        ops: tuple[str, ...] | list[str] = ("*",),
        partial_credit: float = 0.2,
        max_turns: int = 4,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if digits < 1 or terms < 2 or not ops or any(o not in ("+", "-", "*") for o in ops):
            raise ConfigError(
                f"CalculatorEnv needs digits >= 1, terms >= 2, ops from '+-*'; got {digits}, {terms}, {ops}"
            )
        self.digits, self.terms, self.ops = digits, terms, tuple(ops)
        self.partial_credit = partial_credit
        self.expression = ""
        self.value = ""

    def _new_task(self) -> None:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits
        parts = [str(int(self.np_random.integers(lo, hi)))]
        for _ in range(self.terms - 1):
            parts += [
                self.ops[int(self.np_random.integers(len(self.ops)))],
                str(int(self.np_random.integers(lo, hi))),
            ]
        self.expression = " ".join(parts)
        self.value = format_number(evaluate(self.expression))

    def _prompt(self) -> str:
        return f'Compute "{self.expression}" with the calculator.'

    def _score(self, answer: str | None) -> tuple[float, Info]:
        used = self.value in self.evaluated.values()
        correct = answer is not None and answer.replace(",", "").strip() == self.value
        reward = 1.0 if (correct and used) else (self.partial_credit if used else 0.0)
        info = {"answer": self.value, "extracted": answer, "used_tool": used}
        return reward, {**info, "success": correct and used}  # partial credit is no success

    def demonstration(self) -> list[Message] | None:
        if not self.expression:
            return None
        call = ToolCall(name="calculator", arguments={"expression": self.expression}, id="call_0")
        return [
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content=self.value, tool_call_id="call_0", name="calculator"),
            Message(role="assistant", content=f"Answer: {self.value}"),
        ]


class CountdownEnv(_ToolArithmeticEnv):
    """Reach a target from a few numbers with + - *, each number at most once.

    Args:
        count: how many numbers are given.
        max_number: numbers are drawn from 1..max_number.
        unverified_credit: reward for a right expression never checked with the calculator.
        max_turns: steps before truncation.
    """

    def __init__(
        self,
        *,
        count: int = 3,
        max_number: int = 10,
        unverified_credit: float = 0.5,
        max_turns: int = 4,
    ):
        super().__init__(max_turns=max_turns)
        if count < 2 or max_number < 2:
            raise ConfigError(
                f"CountdownEnv needs count >= 2 and max_number >= 2; got {count}, {max_number}"
            )
        self.count, self.max_number = count, max_number
        self.unverified_credit = unverified_credit
        self.numbers: list[int] = []
        self.solution = ""
        self.target = 0

    def _new_task(self) -> None:
        for _ in range(100):  # a positive target; almost always the first draw
            nums = [
                int(x) for x in self.np_random.integers(1, self.max_number + 1, size=self.count)
            ]
            expr = str(nums[0])
            for n in nums[1:]:
                expr = f"{expr} {'+-*'[int(self.np_random.integers(3))]} {n}"
            if evaluate(expr) > 0:
                break
        order = self.np_random.permutation(self.count)
        self.numbers = [nums[int(i)] for i in order]
        self.solution, self.target = expr, int(evaluate(expr))

    def _prompt(self) -> str:
        return (
            f"Use {', '.join(map(str, self.numbers))} to reach {self.target} with the calculator."
        )

    def _score(self, answer: str | None) -> tuple[float, Info]:
        info: Info = {"target": self.target, "extracted": answer}
        if answer is None:
            return 0.0, info
        try:
            value = evaluate(answer)
        except ValueError:
            return 0.0, info
        used = [int(n) for n in re.findall(r"\d+", answer)]
        pool = list(self.numbers)
        for n in used:
            if n not in pool:
                return 0.0, {**info, "reason": f"{n} is not available"}
            pool.remove(n)
        if value != self.target:
            return 0.0, info
        verified = _normalize(answer) in self.evaluated
        return (1.0 if verified else self.unverified_credit), {**info, "verified": verified}

    def demonstration(self) -> list[Message] | None:
        if not self.solution:
            return None
        call = ToolCall(name="calculator", arguments={"expression": self.solution}, id="call_0")
        return [
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(
                role="tool", content=str(self.target), tool_call_id="call_0", name="calculator"
            ),
            Message(role="assistant", content=f"Answer: {self.solution}"),
        ]
