"""Rollouts: the token ledger, the collector that runs AgentLoops, metrics and trajectory IO.

    Sample -> RolloutCollector -> AgentLoop.run -> Trajectory -> TrajectoryGroup (streamed)

Submodules import lazily here so ``import agentrl.rollout`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.rollout.collector import CollectorConfig, RolloutCollector
    from agentrl.rollout.io import load_groups, load_trajectories, save_groups, save_trajectories
    from agentrl.rollout.ledger import TokenLedger
    from agentrl.rollout.metrics import rollout_metrics

_EXPORTS = {
    "CollectorConfig": "agentrl.rollout.collector",
    "RolloutCollector": "agentrl.rollout.collector",
    "TokenLedger": "agentrl.rollout.ledger",
    "rollout_metrics": "agentrl.rollout.metrics",
    "load_groups": "agentrl.rollout.io",
    "load_trajectories": "agentrl.rollout.io",
    "save_groups": "agentrl.rollout.io",
    "save_trajectories": "agentrl.rollout.io",
}

__all__ = [
    "CollectorConfig",
    "RolloutCollector",
    "TokenLedger",
    "load_groups",
    "load_trajectories",
    "rollout_metrics",
    "save_groups",
    "save_trajectories",
]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'agentrl.rollout' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
