"""The built-in loops solve the built-in envs when the model replays their demonstrations."""

from __future__ import annotations

import pytest

from agentrl.env import make_env
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.tool_parsers import get_tool_parser
from agentrl.types import RolloutStatus, Sample


async def demo_texts(env_id: str, seed: int) -> list[str]:
    """The assistant turns of the env's oracle conversation, as the model would write them."""
    env = make_env(env_id)
    await env.areset(seed=seed)
    demo = env.demonstration()
    assert demo is not None
    hermes = get_tool_parser("hermes")
    return [
        m.text + "".join(hermes.format_call(tc) for tc in m.tool_calls)
        for m in demo
        if m.role == "assistant"
    ]


@pytest.mark.parametrize(
    ("env_id", "agent"),
    [
        ("arith/Calculator-v0", "tool_calling"),
        ("arith/Calculator-v0", "env_driver"),
        ("arith/Countdown-v0", "tool_calling"),
        ("arith/Countdown-v0", "env_driver"),
        ("games/GuessNumber-v0", "env_driver"),
        ("reasoning/BasicArithmetic-v0", "single_turn"),
    ],
)
async def test_demonstration_replay_is_rewarded(chatml, env_id, agent) -> None:  # type: ignore[no-untyped-def]
    texts = await demo_texts(env_id, seed=3)
    gen = ScriptedGenerator(chatml, texts)
    cfg = CollectorConfig(group_size=2, agent=agent, check_ledger=True, max_turns=len(texts))
    [group] = await RolloutCollector(cfg, gen, chatml).collect([Sample(env_id=env_id, seed=3)])
    for traj in group.trajectories:
        assert traj.status is RolloutStatus.COMPLETED, traj.error
        assert traj.reward > 0.0 and traj.metrics["success"] == 1.0
        assert traj.num_turns == len(texts)
        assert traj.metrics["ledger_mismatch"] == 0.0
        assert traj.metrics["tool_calls"] == sum("<tool_call>" in t for t in texts)
