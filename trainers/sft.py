"""Supervised fine-tuning on conversations: env demonstrations or a JSONL/parquet dataset.

    env.areset(seed) + env.demonstration() ─┐
    dataset rows {"messages": [...], "tools"} ┴-> conversation_segment (chat template, token ledger)
        -> Segment (loss mask 1 on assistant tokens) -> TrainBatch -> ActorWorker.sft_step (x steps)
        -> export_hf(<run_dir>/sft_model)

A conversation becomes tokens exactly the way a rollout does: the prompt and every env/tool
message are template deltas computed by ``TokenLedger`` (loss mask 0), and each assistant
message is the completion the model should have generated, i.e. its rendered content followed
by the turn-end token (loss mask 1). So SFT teaches the token sequence the RL rollouts will
later sample, turn separators included. Used as the warm-up before GRPO (``sft.steps``) and by
``agentrl sft``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.batch import TrainBatch
from agentrl.chat import ChatTemplate
from agentrl.config import to_dict
from agentrl.env import make_env
from agentrl.errors import ConfigError, TokenizationError
from agentrl.logging import MetricsLogger, Timer, mean_metrics, progress
from agentrl.metrics_schema import StepCounts, step_metrics
from agentrl.rollout.ledger import TokenLedger
from agentrl.splits import reset_sample
from agentrl.types import JSON, Message, Sample, Segment, Trajectory, TrajectoryGroup
from trainers.config import DataConfig, RunConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """Messages to imitate (assistant ones are the targets) and the tool schemas shown."""

    messages: list[Message]
    tools: list[JSON] | None = None


def conversation_segment(template: ChatTemplate, conv: Conversation) -> Segment:
    """Token ids of a conversation with loss mask 1 on the assistant completions."""
    ledger = TokenLedger(template=template, tools=conv.tools)
    msgs = conv.messages
    stop = template.stop_token_ids[:1]
    if not stop:
        raise TokenizationError(
            "the chat template has no turn-end token to end assistant turns with"
        )
    for i, m in enumerate(msgs):
        if m.role != "assistant":
            continue
        if i == 0:
            raise ConfigError("a conversation must not start with an assistant message")
        ledger.prompt(msgs[:i])
        completion = template.encode(_assistant_body(template, msgs[: i + 1], conv.tools)) + list(
            stop
        )
        ledger.add_completion(completion, [0.0] * len(completion), 0, i + 1)
    if not ledger.segments:
        raise ConfigError("a conversation to imitate needs at least one assistant message")
    if len(ledger.segments) > 1:
        raise TokenizationError(
            "SFT needs a prefix-preserving chat template (one segment per conversation)"
        )
    return ledger.segments[0]


def _assistant_body(
    template: ChatTemplate, msgs: Sequence[Message], tools: list[JSON] | None
) -> str:
    """The text the model generates for the last (assistant) message, turn-end excluded."""
    before = template.render_text(msgs[:-1], tools, add_generation_prompt=True)
    full = template.render_text(msgs, tools)
    suffix = template.assistant_suffix
    if not full.startswith(before) or not full.endswith(suffix):
        raise TokenizationError(
            "cannot cut the assistant turn out of the chat template's render; the template "
            f"must be prefix-preserving and end assistant turns with {suffix!r}"
        )
    return full[len(before) : len(full) - len(suffix)]


async def _demonstration(sample: Sample) -> Conversation | None:
    env = make_env(sample.env_id, **sample.env_kwargs)
    try:
        obs, _ = await reset_sample(env, sample)  # a train-split task, as in RL
        demo = await env.ademonstration()
        if demo is None:
            return None
        tools = env.tools.schemas() if env.tools is not None and len(env.tools) else None
        return Conversation(messages=[Message.coerce(m) for m in [*obs, *demo]], tools=tools)
    finally:
        await env.aclose()


DEMO_CONCURRENCY = 32
"""Demonstrations recorded at once (each env open at a time may hold a sandbox or a browser)."""


def demonstrations(data: DataConfig, num: int) -> list[Conversation]:
    """Oracle conversations for the first ``num`` train samples of ``data`` (the train split,
    seeds as in RL); no eval-split task is ever among them."""
    samples = [data.sample(i) for i in range(num)]

    async def all_demos() -> list[Conversation | None]:
        # Bounded: each demonstration may hold a sandbox (SWE, GUI) while it runs.
        slots = asyncio.Semaphore(DEMO_CONCURRENCY)
        with progress("SFT demonstrations", len(samples)) as advance:

            async def one(sample: Sample) -> Conversation | None:
                try:
                    async with slots:
                        return await _demonstration(sample)
                finally:
                    advance()

            return list(await asyncio.gather(*(one(s) for s in samples)))

    convs = [c for c in asyncio.run(all_demos()) if c is not None]
    if not convs:
        ids = sorted({e.id for e in data.envs})
        raise ConfigError(
            f"none of the envs {ids} gives demonstrations; set sft.dataset to a file instead"
        )
    return convs


def load_conversations(path: str | Path) -> list[Conversation]:
    """Rows with ``messages`` (OpenAI format) and optional ``tools``, from .jsonl or .parquet."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sft.dataset {str(p)!r} does not exist")
    rows: list[dict[str, Any]]
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(p).to_pylist()
    elif p.suffix in (".jsonl", ".json"):
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    else:
        raise ConfigError(f"sft.dataset must be .jsonl or .parquet, got {p.name!r}")
    out = []
    for i, row in enumerate(rows):
        if "messages" not in row:
            raise ConfigError(f"{p.name} row {i} has no 'messages' field (keys: {sorted(row)})")
        msgs = row["messages"]
        msgs = json.loads(msgs) if isinstance(msgs, str) else msgs
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        out.append(
            Conversation(messages=[Message.from_openai(m) for m in msgs], tools=tools or None)
        )
    return out


def sft_batches(
    segments: Sequence[Segment], batch_size: int, pad_token_id: int, *, seed: int
) -> Iterator[TrainBatch]:
    """Endless batches of ``batch_size`` segments; a seeded reshuffle every epoch."""
    if not segments:
        raise ConfigError("no SFT examples to train on")
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(len(segments)))
            rng.shuffle(epoch)
            order += epoch
        take, order = order[:batch_size], order[batch_size:]
        yield to_batch([segments[i] for i in take], pad_token_id)


def to_batch(segments: Sequence[Segment], pad_token_id: int) -> TrainBatch:
    """Segments as TrainBatch rows (one single-member group each)."""
    groups = [
        TrajectoryGroup(
            uid=f"sft-{i}",
            trajectories=[Trajectory(sample=Sample(env_id="sft", uid=f"sft-{i}"), segments=[seg])],
        )
        for i, seg in enumerate(segments)
    ]
    return TrainBatch.from_groups(groups, pad_token_id)


def base_model(cfg: RunConfig) -> Path:
    """The model RL (or SFT) starts from: ``model.path``, or the tiny model built under the run dir."""
    if cfg.model.path:
        return Path(cfg.model.path)
    from agentrl.tiny import make_tiny_model

    path = cfg.run_dir / "base_model"
    if not (path / "config.json").is_file():
        t = cfg.model.tiny
        corpus = [
            "\n".join(m.text for m in c.messages)
            for c in (demonstrations(cfg.data, t.corpus_demos) if t.corpus_demos else [])
        ]
        make_tiny_model(
            path,
            arch=t.arch,  # type: ignore[arg-type]
            hidden_size=t.hidden_size,
            num_layers=t.num_layers,
            num_heads=t.num_heads,
            num_kv_heads=t.num_kv_heads,
            intermediate_size=t.intermediate_size or None,
            vocab_size=t.vocab_size,
            seed=cfg.seed if t.seed is None else t.seed,
            dtype="float32",
            corpus=corpus,
        )
    return path


_DONE = "agentrl_sft.json"


def warm_up(cfg: RunConfig, *, num_threads: int) -> Path:
    """The policy RL starts from: the base model, or its SFT warm-up (trained once per run dir)."""
    base = base_model(cfg)
    if not cfg.sft.steps:
        return base
    out = cfg.run_dir / "sft_model"
    if (out / _DONE).is_file():
        logger.info("SFT warm-up already done: %s", out)
        return out
    metrics = run_sft(cfg, base, out, num_threads=num_threads)
    (out / _DONE).write_text(json.dumps({"steps": cfg.sft.steps, **metrics}))
    return out


def run_sft(cfg: RunConfig, model: Path, out: Path, *, num_threads: int) -> dict[str, float]:
    """``sft.steps`` optimizer steps on demonstrations (or ``sft.dataset``); export HF to ``out``."""
    from dataclasses import replace

    from agentrl.distributed import ResourcePool, WorkerGroup
    from trainers.runtime import pool_config
    from trainers.workers import ActorWorker

    template = ChatTemplate.from_pretrained(model)
    s = cfg.sft
    convs = load_conversations(s.dataset) if s.dataset else demonstrations(cfg.data, s.num_demos)
    segments = [conversation_segment(template, c) for c in convs]
    engine_cfg = replace(
        cfg.engine,
        model_path=str(model),
        role="actor",
        lr=s.lr,
        lr_schedule=s.lr_schedule,
        warmup_steps=0,
        total_steps=s.steps,
        min_lr_ratio=0.1,
        seed=cfg.seed,
    )
    pool = ResourcePool(pool_config(cfg))
    group = WorkerGroup(
        pool,
        ActorWorker,
        kwargs={
            "cfg": engine_cfg,
            "num_threads": num_threads,
            "options": cfg.engine_options(engine_cfg.backend),
        },
        name="sft",
    )
    log = MetricsLogger(
        replace(cfg.logging, console=False),
        out.parent / "sft_logs",
        name=cfg.name,
        job="sft",
        run_config=to_dict(cfg),
    )
    last: list[dict[str, float]] = []
    timer = Timer()
    try:
        batches = sft_batches(
            segments, s.batch_size, int(template.tokenizer.pad_token_id), seed=cfg.seed
        )
        with progress("SFT warm-up", s.steps) as advance:
            for step in range(1, s.steps + 1):
                batch = next(batches)
                t0 = time.perf_counter()
                with timer.time("update"):
                    m = mean_metrics(group.call(ActorWorker.sft_step, batch, s.prompt_loss_weight))
                counts = StepCounts(train_tokens=batch.num_tokens, samples=len(batch))
                step_s = time.perf_counter() - t0
                log.log(m | step_metrics(timer.pop(), step_s=step_s, counts=counts), step)
                last = [*last[-9:], m]
                advance()
        group.call(ActorWorker.export_hf, str(out))
    finally:
        log.close()
        group.shutdown()
    final = mean_metrics(last)
    logger.info(
        "SFT: %d steps on %d conversations, final loss %.4f",
        s.steps,
        len(segments),
        final.get("sft/loss", 0.0),
    )
    return final
