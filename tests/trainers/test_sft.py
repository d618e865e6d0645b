from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import ENVS, Env, register_env
from agentrl.errors import ConfigError
from agentrl.tiny import make_tiny_model
from agentrl.types import Message
from trainers.config import DataConfig, EnvEntry
from trainers.sft import (
    Conversation,
    conversation_segment,
    demonstrations,
    load_conversations,
    sft_batches,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1)


@pytest.fixture(scope="module")
def template(model: Path) -> ChatTemplate:
    return ChatTemplate.from_pretrained(model)


def test_demonstration_trains_exactly_the_assistant_turns(template: ChatTemplate) -> None:
    data = DataConfig(envs=[EnvEntry(id="arith/Calculator-v0")])
    conv = demonstrations(data, 1)[0]
    seg = conversation_segment(template, conv)
    # The ledger equals a full render of the conversation (same tokens a rollout would hold).
    assert template.check_ledger(conv.messages, seg.token_ids, conv.tools).ok
    trained = template.decode([t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m])
    call, _tool, answer = conv.messages[-3:]
    expr = call.tool_calls[0].arguments["expression"]
    assert trained == (
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call><|im_end|>'
        f"{answer.content}<|im_end|>"
    )


def test_demonstrations_follow_the_train_seeds(template: ChatTemplate) -> None:
    data = DataConfig(envs=[EnvEntry(id="arith/Calculator-v0")], seed=5)
    a, b = demonstrations(data, 3), demonstrations(data, 3)
    assert [c.messages for c in a] == [c.messages for c in b]
    assert len({c.messages[-1].content for c in a}) > 1


class _ActingOracle(Env):
    """An env whose oracle must act first: only ``ademonstration`` knows the answer."""

    async def areset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        await super().areset(seed=seed)
        self.secret = int(self.np_random.integers(1000))
        return [Message(role="user", content=f"task {seed}")], {}

    async def astep(self, action):  # type: ignore[no-untyped-def]
        return [], float(action.text == str(self.secret)), True, False, {}

    async def ademonstration(self) -> list[Message] | None:
        await asyncio.sleep(0)  # e.g. ran commands in a sandbox to learn the answer
        return [Message(role="assistant", content=str(self.secret))]


def test_demonstrations_come_from_the_async_oracle() -> None:
    if "test-sft/Acting-v0" not in ENVS:
        register_env("test-sft/Acting-v0", _ActingOracle)
    data = DataConfig(envs=[EnvEntry(id="test-sft/Acting-v0")])
    convs = demonstrations(data, 3)
    assert len(convs) == 3 and all(c.messages[-1].role == "assistant" for c in convs)
    assert all(c.messages[-1].text.isdigit() for c in convs)


class _CountingOracle(_ActingOracle):
    """Counts the oracles running at once (each could hold a sandbox)."""

    running = peak = 0

    async def ademonstration(self) -> list[Message] | None:
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        try:
            await asyncio.sleep(0.01)
            return await super().ademonstration()
        finally:
            cls.running -= 1


def test_demonstrations_are_recorded_a_bounded_number_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trainers.sft as sft

    monkeypatch.setattr(sft, "DEMO_CONCURRENCY", 4)
    if "test-sft/Counting-v0" not in ENVS:
        register_env("test-sft/Counting-v0", _CountingOracle)
    data = DataConfig(envs=[EnvEntry(id="test-sft/Counting-v0")])
    assert len(demonstrations(data, 20)) == 20
    assert _CountingOracle.peak == 4


def test_conversation_without_assistant_turn_is_rejected(template: ChatTemplate) -> None:
    with pytest.raises(ConfigError, match="assistant"):
        conversation_segment(template, Conversation(messages=[Message(role="user", content="hi")]))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_load_conversations(tmp_path: Path, suffix: str, template: ChatTemplate) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"a{i}"},
            ]
        }
        for i in range(3)
    ]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"messages": [json.dumps(r["messages"]) for r in rows]}), path)
    convs = load_conversations(path)
    assert [c.messages[1].content for c in convs] == ["a0", "a1", "a2"]
    seg = conversation_segment(template, convs[0])
    assert (
        template.decode([t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m])
        == "a0<|im_end|>"
    )


def test_sft_batches_cover_every_example_each_epoch_and_are_seeded(template: ChatTemplate) -> None:
    convs = [
        Conversation(
            messages=[
                Message(role="user", content=f"q{i}"),
                Message(role="assistant", content=f"a{i}"),
            ]
        )
        for i in range(6)
    ]
    segs = [conversation_segment(template, c) for c in convs]
    pad = int(template.tokenizer.pad_token_id)

    def epoch(seed: int) -> list[str]:
        it = sft_batches(segs, 3, pad, seed=seed)
        batches = (next(it), next(it))
        return [
            template.decode(row[:n])
            for b in batches
            for row, n in zip(b.input_ids.tolist(), b.seq_lens.tolist(), strict=True)
        ]

    first = epoch(0)
    assert first == epoch(0)
    questions = [q for text in first for q in re.findall(r"q\d", text)]
    assert sorted(questions) == [f"q{i}" for i in range(6)]


def test_sft_step_lowers_the_loss(model: Path, template: ChatTemplate) -> None:
    from agentrl.engine import EngineConfig
    from trainers.workers import ActorWorker

    data = DataConfig(envs=[EnvEntry(id="arith/Calculator-v0")])
    segs = [conversation_segment(template, c) for c in demonstrations(data, 8)]
    worker = ActorWorker(
        EngineConfig(model_path=str(model), lr=1e-2, device="cpu", micro_batch_size=8)
    )
    batches = sft_batches(segs, 8, int(template.tokenizer.pad_token_id), seed=0)
    losses = [worker.sft_step(next(batches))[0]["sft/loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0]
