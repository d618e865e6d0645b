"""Reward functions and rubrics: plain callables, weighted, failures kept as values.

    def correct(completion, info) -> float:          # sync or async
        return float(final_answer(completion) == info["answer"])

    @group_reward
    async def best_of_group(completions, infos) -> list[float]:   # sees the whole GRPO group
        ...

    rubric = Rubric([(correct, 1.0), (best_of_group, 0.5), (length, 0.0)])  # length: metric only
    result = await rubric.score(trajectory, {"answer": "42"})
    result.total, result.components, result.metrics, result.error

Signatures:
- a reward function is ``fn(completion, info) -> float`` (or ``Awaitable[float]``), where
  ``completion`` is a ``Trajectory`` or a ``list[Message]`` (whatever the caller scores) and
  ``info`` is a mapping with what the task knows (the reference answer, the env's final
  ``info``, the ``Sample``'s ``extra``);
- a group-aware function, marked with ``@group_reward``, is
  ``fn(completions: list, infos: list) -> list[float]`` (one score per completion, in order),
  for relative judging (pairwise comparisons, best-of-group, an LLM judge ranking a group).

A function that raises, returns a non-number or a non-finite number does not crash the
step: the result carries ``error`` (a ``RewardError`` message) and ``status``
``RolloutStatus.ERROR_REWARD``, which the trainer masks out of the loss. Sync functions
run inline on the event loop; write blocking ones as ``async`` (or use ``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from agentrl.errors import ConfigError, RewardError
from agentrl.types import Message, RolloutStatus, Trajectory

logger = logging.getLogger(__name__)

Completion: TypeAlias = Trajectory | list[Message]
RewardInfo: TypeAlias = Mapping[str, Any]
RewardFn: TypeAlias = Callable[[Any, RewardInfo], "float | Awaitable[float]"]
GroupRewardFn: TypeAlias = Callable[
    [list[Any], list[RewardInfo]], "list[float] | Awaitable[list[float]]"
]

_GROUP_ATTR = "__agentrl_group_reward__"


def group_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn(completions, infos) -> list[float]`` as group-aware (it scores a whole group)."""
    setattr(fn, _GROUP_ATTR, True)
    return fn


def is_group_reward(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _GROUP_ATTR, False))


def env_reward(completion: Any, info: RewardInfo) -> float:
    """The env's own reward for the rollout (``info["env_reward"]``, set by the collector).

    Put it in a rubric to keep the env's reward as one weighted term:
    ``Rubric([(env_reward, 1.0), (format_bonus, 0.1)])``.
    """
    return float(info["env_reward"])


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardResult:
    """The score of one completion.

    ``total`` is the weighted sum of the weighted functions' scores; ``components`` holds
    each weighted function's raw (unweighted) score and ``metrics`` each zero-weight one's.
    ``error`` is set (and ``total`` is 0.0) when any function failed.
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def status(self) -> RolloutStatus:
        return RolloutStatus.ERROR_REWARD if self.error else RolloutStatus.COMPLETED

    def raise_for_error(self) -> None:
        if self.error:
            raise RewardError(self.error)


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    fn: Callable[..., Any]
    weight: float
    group: bool


class Rubric:
    """Weighted reward functions. Entries are ``fn``, ``(fn, weight)`` or ``(fn, weight, name)``.

    Zero-weight functions are computed and reported as metrics only.
    """

    def __init__(self, funcs: Iterable[Callable[..., Any] | tuple[Any, ...]]) -> None:
        self.entries: list[_Entry] = []
        for item in funcs:
            fn, weight, name = _unpack(item)
            base, n = name, 2
            while any(e.name == name for e in self.entries):
                name, n = f"{base}_{n}", n + 1
            self.entries.append(_Entry(name, fn, weight, is_group_reward(fn)))
        if not self.entries:
            raise ConfigError("a Rubric needs at least one reward function")

    def __repr__(self) -> str:
        return "Rubric(" + ", ".join(f"{e.name}×{e.weight:g}" for e in self.entries) + ")"

    async def score(self, completion: Any, info: RewardInfo | None = None) -> RewardResult:
        """Score one completion (group-aware functions see a group of one)."""
        return (await self.score_group([completion], [info or {}]))[0]

    async def score_group(
        self, completions: Sequence[Any], infos: Sequence[RewardInfo] | None = None
    ) -> list[RewardResult]:
        """Score a group's completions together; returns one result per completion, in order."""
        n = len(completions)
        infos_ = list(infos) if infos is not None else [{} for _ in range(n)]
        if len(infos_) != n:
            raise ConfigError(f"score_group got {n} completions but {len(infos_)} infos")
        per_fn = await asyncio.gather(
            *(self._run_entry(e, list(completions), infos_) for e in self.entries)
        )
        results = []
        for i in range(n):
            comps: dict[str, float] = {}
            metrics: dict[str, float] = {}
            errors: list[str] = []
            total = 0.0
            for e, scores in zip(self.entries, per_fn, strict=True):
                s = scores[i]
                if isinstance(s, str):
                    errors.append(s)
                    continue
                (metrics if e.weight == 0 else comps)[e.name] = s
                total += e.weight * s
            err = "; ".join(errors) or None
            results.append(
                RewardResult(
                    total=0.0 if err else total, components=comps, metrics=metrics, error=err
                )
            )
        return results

    async def _run_entry(
        self, e: _Entry, completions: list[Any], infos: list[RewardInfo]
    ) -> list[float | str]:
        """Scores of one function for every completion; an error string where it failed."""
        if e.group:
            try:
                out = await _maybe_await(e.fn(completions, infos))
            except Exception as exc:
                return [_error(e.name, exc)] * len(completions)
            if not isinstance(out, Sequence) or len(out) != len(completions):
                got = len(out) if isinstance(out, Sequence) else type(out).__name__
                msg = f"group reward {e.name!r} must return {len(completions)} scores, got {got}"
                return [msg] * len(completions)
            return [_as_score(e.name, s) for s in out]

        async def one(c: Any, info: RewardInfo) -> float | str:
            try:
                return _as_score(e.name, await _maybe_await(e.fn(c, info)))
            except Exception as exc:
                return _error(e.name, exc)

        return list(
            await asyncio.gather(*(one(c, i) for c, i in zip(completions, infos, strict=True)))
        )


def _unpack(item: Callable[..., Any] | tuple[Any, ...]) -> tuple[Callable[..., Any], float, str]:
    if callable(item):
        return item, 1.0, _name(item)
    if isinstance(item, tuple) and 2 <= len(item) <= 3 and callable(item[0]):
        weight = item[1]
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
        ):
            raise ConfigError(
                f"reward weight for {_name(item[0])!r} must be a finite number, got {weight!r}"
            )
        name = str(item[2]) if len(item) == 3 else _name(item[0])
        return item[0], float(weight), name
    raise ConfigError(f"Rubric entries are fn, (fn, weight) or (fn, weight, name); got {item!r}")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


async def _maybe_await(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


def _as_score(name: str, s: Any) -> float | str:
    if not isinstance(s, numbers.Real):  # bools and numpy scalars are fine
        return f"reward {name!r} returned {type(s).__name__} {s!r}; expected a float"
    if not math.isfinite(float(s)):
        return f"reward {name!r} returned {s}; expected a finite float"
    return float(s)


def _error(name: str, exc: BaseException) -> str:
    logger.warning("reward function %s raised %s: %s", name, type(exc).__name__, exc)
    return f"reward {name!r} raised {type(exc).__name__}: {exc}"


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_LINE = re.compile(r"answer\s*[:=]\s*(.+)", re.I)


def extract_answer(text: str) -> str | None:
    """The final answer in a completion, or None.

    Looks for the last ``<answer>...</answer>``; failing that, the last ``Answer: ...`` (the
    rest of that line, trailing period removed). Both are what the built-in envs ask for.
    """
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return str(tags[-1]).strip()
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return str(lines[-1]).strip().rstrip(".").strip()
    return None
