"""Built-in AgentLoops over scripted and real (tiny torch) generators: ledger invariants,
per-turn segments for history-rewriting templates, parse errors, limits and statuses."""

from __future__ import annotations

import json
import math

import pytest

from agentrl.agent import AgentLoop, RolloutContext, register_agent
from agentrl.chat import ChatTemplate
from agentrl.env import make_env
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import (
    FORCED_THINK_TEMPLATE as FORCED_THINK,
)
from agentrl.rollout.testing import (
    THINK_STRIPPING_TEMPLATE as THINK_STRIPPING,
)
from agentrl.rollout.testing import (
    ScriptedGenerator,
    TorchGenerator,
)
from agentrl.types import Message, RolloutStatus, Sample, Trajectory

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'


async def run_one(template, gen, sample: Sample, **cfg) -> Trajectory:  # type: ignore[no-untyped-def]
    config = CollectorConfig(group_size=1, check_ledger=True, **cfg)
    [group] = await RolloutCollector(config, gen, template).collect([sample])
    return group.trajectories[0]


def assert_ledger_invariants(traj: Trajectory) -> None:
    """loss_mask is 1 exactly on generated tokens; logprobs/versions line up with them."""
    gen_ids = [t for turn in traj.turns for t in turn.completion_ids]
    gen_lps = [lp for turn in traj.turns for lp in turn.completion_logprobs]
    gen_vs = [turn.weight_version for turn in traj.turns for _ in turn.completion_ids]
    masked_ids, masked_lps, masked_vs = [], [], []
    for seg in traj.segments:
        seg.validate()
        for tid, m, lp, v in zip(
            seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions, strict=True
        ):
            if m:
                masked_ids.append(tid)
                masked_lps.append(lp)
                masked_vs.append(v)
            else:
                assert (lp, v) == (0.0, -1)
    assert masked_ids == gen_ids
    assert masked_lps == gen_lps
    assert masked_vs == gen_vs
    assert traj.metrics["ledger_mismatch"] == 0.0


def calc_responses(gen_holder: list) -> object:  # type: ignore[type-arg]
    def respond(prompt: str, turn: int) -> str:
        gen_holder[0].weight_version = 10 + turn  # a weight update between turns
        return CALL if turn == 0 else "The answer is 84."

    return respond


@pytest.mark.parametrize("template_src", [None, FORCED_THINK, THINK_STRIPPING])
async def test_tool_calling_ledger(tokenizer, template_src) -> None:  # type: ignore[no-untyped-def]
    ct = ChatTemplate(tokenizer, chat_template=template_src)
    holder: list = []
    if template_src == THINK_STRIPPING:
        first = "<think>\nneed a tool\n</think>\n\n" + CALL
        holder_resp = lambda p, t: (  # noqa: E731
            setattr(holder[0], "weight_version", 10 + t)
            or (first if t == 0 else "The answer is 84.")
        )
        gen = ScriptedGenerator(ct, holder_resp)
    else:
        gen = ScriptedGenerator(ct, calc_responses(holder))  # type: ignore[arg-type]
    holder.append(gen)
    traj = await run_one(ct, gen, Sample(env_id="test-agents/Calc-v0"), agent="tool_calling")
    assert traj.status is RolloutStatus.COMPLETED, traj.error
    assert traj.reward == 1.0 and traj.metrics["success"] == 1.0
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3].content == "84"
    assert traj.metrics["tool_calls"] == 1.0 and traj.metrics["tool_errors"] == 0.0
    assert [t.weight_version for t in traj.turns] == [10, 11]
    assert_ledger_invariants(traj)
    if template_src == THINK_STRIPPING:  # not prefix-preserving: one segment per turn
        assert len(traj.segments) == 2
        assert all(s.prompt_len > 0 and s.num_generated > 0 for s in traj.segments)
    else:
        [seg] = traj.segments
        tools = make_env("test-agents/Calc-v0").tools.schemas()
        # the conversation with each assistant turn as the text the model generated
        raw = list(traj.messages)
        for i, turn in zip((2, 4), traj.turns, strict=True):
            raw[i] = Message(role="assistant", content=ct.completion_text(turn.completion_ids))
        assert ct.check_ledger(raw, seg.token_ids, tools).ok
        # token-exact: identical to tokenizing a full render of that conversation
        assert seg.token_ids == ct.render(raw, tools)[: len(seg)]


async def test_env_driver_multi_turn_guessing(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, ["3", "8", "6"])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/Guess-v0", seed=6), agent="env_driver"
    )
    assert traj.status is RolloutStatus.COMPLETED
    assert traj.reward == 1.0 and traj.num_turns == 3
    assert [m.content for m in traj.messages if m.role == "user"][1:] == [
        "Wrong, go higher.",
        "Wrong, go lower.",
        "Correct!",
    ]
    assert_ledger_invariants(traj)
    assert traj.llm_time_s >= 0.0 and traj.env_time_s > 0.0


async def test_malformed_tool_call_is_an_observation_not_a_step(chatml) -> None:  # type: ignore[no-untyped-def]
    bad = '<tool_call>{"name": "calculator", "arguments": </tool_call>'
    gen = ScriptedGenerator(chatml, [bad, "5"])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/ToolGuess-v0", seed=5), agent="env_driver"
    )
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0
    assert traj.metrics["parse_errors"] == 1.0
    roles = [m.role for m in traj.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert "could not be parsed" in traj.messages[2].text
    assert_ledger_invariants(traj)


async def test_tool_errors_are_counted(chatml) -> None:  # type: ignore[no-untyped-def]
    bad_args = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "import os"}}</tool_call>'
    )
    gen = ScriptedGenerator(chatml, [bad_args, "84"])
    traj = await run_one(chatml, gen, Sample(env_id="test-agents/Calc-v0"), agent="tool_calling")
    assert traj.status is RolloutStatus.COMPLETED and traj.reward == 1.0
    assert traj.metrics["tool_calls"] == 1.0 and traj.metrics["tool_errors"] == 1.0
    assert traj.messages[3].role == "tool" and "Error" in traj.messages[3].text


async def test_max_turns(chatml) -> None:  # type: ignore[no-untyped-def]
    gen = ScriptedGenerator(chatml, ["1"])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/Guess-v0", seed=9), agent="env_driver", max_turns=3
    )
    assert traj.status is RolloutStatus.TRUNCATED_MAX_TURNS and traj.error is None
    assert traj.num_turns == 3 and traj.trainable
    assert_ledger_invariants(traj)


async def test_context_full_and_length_finish(chatml) -> None:  # type: ignore[no-untyped-def]
    long = "1 " * 40
    gen = ScriptedGenerator(chatml, [long])
    sample = Sample(env_id="test-agents/Guess-v0", seed=9)
    # the first completion is cut by max_new_tokens: finish_reason length on the last turn
    traj = await run_one(chatml, gen, sample, agent="single_turn", max_new_tokens=8)
    assert traj.turns[-1].finish_reason == "length"
    assert traj.status is RolloutStatus.TRUNCATED_LENGTH
    assert traj.turns[0].completion_ids[-1] not in chatml.stop_token_ids
    assert_ledger_invariants(traj)
    # multi-turn until the context is full: never more than max_tokens per segment
    traj = await run_one(
        chatml, gen, sample, agent="env_driver", max_tokens=120, max_new_tokens=16, max_turns=50
    )
    assert traj.status is RolloutStatus.TRUNCATED_LENGTH
    assert traj.num_turns >= 2 and all(len(s) <= 120 for s in traj.segments)
    assert_ledger_invariants(traj)


async def test_real_tiny_model_multi_turn(tiny_model_path) -> None:  # type: ignore[no-untyped-def]
    gen = TorchGenerator.from_pretrained(tiny_model_path, seed=1)
    ct = gen.template
    traj = await run_one(
        ct,
        gen,
        Sample(env_id="test-agents/Guess-v0", seed=7),
        agent="env_driver",
        max_turns=3,
        max_new_tokens=12,
        tool_parser=None,
    )
    assert traj.num_turns == 3 or traj.status is RolloutStatus.COMPLETED
    assert_ledger_invariants(traj)
    lps = [lp for t in traj.turns for lp in t.completion_logprobs]
    assert lps and all(lp <= 0.0 and math.isfinite(lp) for lp in lps)
    # teacher-forced rescoring of the generated tokens gives the same logprobs (temperature 1)
    seg = traj.segments[0]
    rescored = TorchGenerator(gen.model, ct)._score(
        seg.token_ids[: seg.prompt_len], traj.turns[0].completion_ids
    )
    assert rescored == pytest.approx(traj.turns[0].completion_logprobs, abs=1e-4)
    json.dumps(traj.to_dict())


class CompactingLoop(AgentLoop):
    """Two turns; the second starts a new segment and is driven in token mode once."""

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        await ctx.reset()
        first = await ctx.generate()
        await ctx.step(first.message)
        ctx.new_segment()
        second = await ctx.generate()
        await ctx.step(second.message)
        extra = ctx.template.encode("<|im_start|>user\nOnce more.<|im_end|>\n")
        await ctx.generate(prompt_ids=extra + ctx.template.generation_prompt_ids)


async def test_new_segment_and_token_mode(chatml) -> None:  # type: ignore[no-untyped-def]
    register_agent("test-compacting", CompactingLoop, override=True)
    gen = ScriptedGenerator(chatml, ["3", "4", "5"])
    traj = await run_one(
        chatml, gen, Sample(env_id="test-agents/Guess-v0", seed=9, agent="test-compacting")
    )
    assert traj.status is RolloutStatus.COMPLETED and traj.num_turns == 3
    assert len(traj.segments) == 2
    first, second = traj.segments
    assert first.num_generated == len(traj.turns[0].completion_ids)
    # the new segment is a full render of the conversation so far: it repeats the first turn
    assert second.token_ids[: first.prompt_len] == first.token_ids[: first.prompt_len]
    assert chatml.decode(second.token_ids).endswith(
        "Once more.<|im_end|>\n<|im_start|>assistant\n5<|im_end|>"
    )
    assert_ledger_invariants(traj)
