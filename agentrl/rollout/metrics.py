"""Aggregate metrics over finished trajectories (``rollout/...`` keys for the logger).

    trajectories -> {"rollout/reward_mean": ..., "rollout/status/completed": 0.9,
                     "rollout/reward/<component>": ..., ...}

Rates are fractions of trajectories; ``*_mean`` are means over trajectories. Every
``RolloutStatus`` gets a ``rollout/status/<status>`` key (0.0 when absent) so dashboards have
stable series. A loop's own ``ctx.metrics["name"]`` becomes ``rollout/name_mean``, the mean
over the trajectories that report it (``rollout/custom/name_mean`` where that name is taken).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from agentrl.types import RolloutStatus, Trajectory


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def rollout_metrics(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """Means and rates over ``trajectories``; empty input gives zeros."""
    ts = list(trajectories)
    n = len(ts)
    rewards = [t.reward for t in ts]
    mean_r = _mean(rewards)
    tool_calls = sum(t.metrics.get("tool_calls", 0.0) for t in ts)
    tool_errors = sum(t.metrics.get("tool_errors", 0.0) for t in ts)
    turns = sum(t.num_turns for t in ts)
    out = {
        "rollout/num_trajectories": float(n),
        "rollout/reward_mean": mean_r,
        "rollout/reward_std": math.sqrt(_mean([(r - mean_r) ** 2 for r in rewards])),
        "rollout/success_rate": _mean([t.metrics.get("success", float(t.reward > 0)) for t in ts]),
        "rollout/turns_mean": _mean([float(t.num_turns) for t in ts]),
        "rollout/response_len_mean": _mean([float(t.num_generated_tokens) for t in ts]),
        "rollout/seq_len_mean": _mean([float(sum(len(s) for s in t.segments)) for t in ts]),
        "rollout/segments_mean": _mean([float(len(t.segments)) for t in ts]),
        "rollout/tool_calls_mean": tool_calls / n if n else 0.0,
        "rollout/tool_error_rate": tool_errors / tool_calls if tool_calls else 0.0,
        "rollout/parse_errors_per_turn": (
            sum(t.metrics.get("parse_errors", 0.0) for t in ts) / turns if turns else 0.0
        ),
        "rollout/trainable_rate": _mean([float(t.trainable) for t in ts]),
        "rollout/llm_time_mean_s": _mean([t.llm_time_s for t in ts]),
        "rollout/env_time_mean_s": _mean([t.env_time_s for t in ts]),
        "rollout/wall_time_mean_s": _mean([t.wall_time_s for t in ts]),
        "rollout/wall_time_max_s": max((t.wall_time_s for t in ts), default=0.0),
    }
    for status in RolloutStatus:
        out[f"rollout/status/{status.value}"] = _mean([float(t.status is status) for t in ts])
    out |= _reward_parts(ts)
    for k, v in _custom_metrics(ts).items():  # a loop's "reward" must not hide reward_mean
        out[k if k not in out else k.replace("rollout/", "rollout/custom/", 1)] = v
    return out


# Per-trajectory metrics that the keys above already aggregate.
_BUILTIN_METRICS = frozenset({"tool_calls", "tool_errors", "parse_errors", "success", "turns"})


def _custom_metrics(ts: list[Trajectory]) -> dict[str, float]:
    """``rollout/<name>_mean`` for each other ``Trajectory.metrics`` key (a loop's own
    ``ctx.metrics``), averaged over the trajectories that have it."""
    values: dict[str, list[float]] = {}
    for t in ts:
        for k, v in t.metrics.items():
            if k not in _BUILTIN_METRICS and not k.startswith("reward/"):
                values.setdefault(k, []).append(float(v))
    return {f"rollout/{k}_mean": _mean(v) for k, v in sorted(values.items())}


def _reward_parts(ts: list[Trajectory]) -> dict[str, float]:
    """``rollout/reward/<name>``: each reward component (a rubric's weighted functions, an
    env's ``reward_components``) and each zero-weight rubric metric, averaged over the
    trajectories that have it."""
    parts: dict[str, list[float]] = {}
    for t in ts:
        for k, v in t.reward_components.items():
            parts.setdefault(k, []).append(v)
        for k, v in t.metrics.items():
            if k.startswith("reward/"):
                parts.setdefault(k.removeprefix("reward/"), []).append(v)
    return {f"rollout/reward/{k}": _mean(v) for k, v in sorted(parts.items())}
