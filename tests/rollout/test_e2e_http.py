"""End to end over real HTTP: the embedded server in its own process, the InferenceClient and
64 concurrent tool-calling rollouts of arith/Calculator-v0 with the tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.tiny import make_tiny_model
from agentrl.types import RolloutStatus, Sample

OK = {RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED_LENGTH, RolloutStatus.TRUNCATED_MAX_TURNS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = make_tiny_model(tmp_path_factory.mktemp("e2e") / "model")
    with ServerProcess(
        ServerProcess.Config(model=str(path), max_batch_size=64, num_threads=1)
    ) as srv:
        yield path, srv


async def test_64_concurrent_tool_rollouts_over_http(server) -> None:  # type: ignore[no-untyped-def]
    path, srv = server
    template = ChatTemplate.from_pretrained(path)
    cfg = CollectorConfig(
        group_size=8,
        max_concurrency=64,
        max_turns=3,
        max_new_tokens=12,
        agent="tool_calling",
        check_ledger=True,
    )
    async with InferenceClient([srv.url]) as client:
        collector = RolloutCollector(cfg, client, template)
        samples = [Sample(env_id="arith/Calculator-v0", seed=i) for i in range(8)]
        groups = [g async for g in collector.stream(samples)]
    trajs = [t for g in groups for t in g.trajectories]
    assert len(groups) == 8 and len(trajs) == 64
    assert {t.status for t in trajs} <= OK, {t.error for t in trajs}
    for t in trajs:
        assert t.metrics["ledger_mismatch"] == 0.0
        assert t.turns and all(turn.completion_ids for turn in t.turns)
        for turn in t.turns:
            assert len(turn.completion_logprobs) == len(turn.completion_ids)
            assert all(lp <= 0.0 for lp in turn.completion_logprobs)
        gen = [lp for s in t.segments for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m]
        assert gen == [lp for turn in t.turns for lp in turn.completion_logprobs]
        assert t.llm_time_s > 0.0
    # The loss mask is 1 exactly where the completions' tokens sit, in order.
    for t in trajs:
        seg = t.segments[0]
        generated = [tok for tok, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
        assert generated == [tok for turn in t.turns for tok in turn.completion_ids]
    # Server logprobs equal a teacher-forced recomputation by the same model (fp32).
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    diffs = []
    with torch.no_grad():
        for t in trajs:
            for seg in t.segments:
                ids = torch.tensor([seg.token_ids])
                logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)  # (T, V)
                pos = [i for i, m in enumerate(seg.loss_mask) if m]
                ref = logp[[p - 1 for p in pos], [seg.token_ids[p] for p in pos]]
                served = torch.tensor([seg.logprobs[p] for p in pos])
                diffs.append((ref - served).abs())
    all_diffs = torch.cat(diffs)
    assert all_diffs.numel() > 0
    assert all_diffs.mean().item() <= 1e-4, all_diffs.mean().item()
    m = RolloutCollector.metrics(groups)
    assert m["rollout/num_trajectories"] == 64.0 and m["rollout/response_len_mean"] > 0
