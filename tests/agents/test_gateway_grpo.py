"""One GRPO step on gateway trajectories: a tiny model sampled in-process, trained on CPU.

The recorded tokens are what the model sampled: the trainer's teacher-forced logprobs of the
ledger's generated tokens equal the sampler's, and a policy step on them changes the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import torch

from agentrl.agent import register_agent
from agentrl.algos.advantages import AdvantageConfig, AdvantageInputs
from agentrl.algos.registry import ADV_ESTIMATORS
from agentrl.batch import TrainBatch
from agentrl.engine import EngineConfig
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import TorchGenerator
from agentrl.tiny import make_tiny_model
from agentrl.types import Message, Sample
from agents.gateway_agent import GatewayAgentLoop, GatewayTask
from trainers.engines.torch_native import TorchEngine
from trainers.updates import PolicyLoss, PolicyUpdate


async def two_turns(task: GatewayTask) -> None:
    async with openai.AsyncOpenAI(
        base_url=task.base_url, api_key=task.api_key, max_retries=0
    ) as oa:
        messages: list[Any] = list(task.messages)
        for k in range(2):
            r = await oa.chat.completions.create(model=task.model, messages=messages)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": f"Once more ({k})."})


def reward(env: Any, messages: list[Message]) -> float:
    last = next(m for m in reversed(messages) if m.role == "assistant")
    return float(len(last.text) % 3)  # varies within a group, so GRPO has a signal


async def test_one_grpo_step_on_gateway_trajectories(tmp_path: Path) -> None:
    model_path = str(make_tiny_model(tmp_path / "model"))
    gen = TorchGenerator.from_pretrained(model_path, seed=1)
    template = gen.template
    register_agent("test-gw-grpo", GatewayAgentLoop, agent=two_turns, reward=reward, override=True)
    config = CollectorConfig(
        group_size=4, agent="test-gw-grpo", max_new_tokens=8, check_ledger=True
    )
    groups = await RolloutCollector(config, gen, template).collect(
        [Sample(env_id="test-agents/Calc-v0", seed=0), Sample(env_id="test-agents/Calc-v0", seed=1)]
    )
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.trainable for t in trajs), [(t.status, t.error) for t in trajs]
    assert all(len(t.segments) == 1 and len(t.turns) == 2 for t in trajs)
    assert all(t.metrics["ledger_mismatch"] == 0 for t in trajs)

    batch = TrainBatch.from_groups(groups, pad_token_id=0)
    engine = TorchEngine(EngineConfig(model_path=model_path, device="cpu", lr=1e-2))
    engine.initialize()
    old, _ = engine.compute_logprobs(batch)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) == sum(t.num_generated_tokens for t in trajs)
    # the ledger's tokens are the sampled ones: teacher forcing gives the sampler's logprobs
    torch.testing.assert_close(old[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=0)
    batch["old_logprobs"] = old
    inputs = AdvantageInputs(
        response_mask=batch.loss_mask, token_rewards=batch.token_rewards, group_ids=batch.group_ids
    )
    batch["advantages"], batch["returns"] = ADV_ESTIMATORS.get("grpo")(inputs, AdvantageConfig())
    assert float(batch["advantages"].abs().sum()) > 0
    before = {n: t.clone() for n, t in engine.named_weights()}
    engine.forward_backward(batch, PolicyLoss(PolicyUpdate()))
    step = engine.optimizer_step()
    assert step["train/grad_norm"] > 0
    assert any(not torch.equal(before[n], t) for n, t in engine.named_weights())
