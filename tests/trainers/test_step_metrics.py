"""One metrics schema for timings, throughput and driver traffic (``agentrl.metrics_schema``).

A short real run (the shrunk quickstart of test_driver.py, with a reference model so two
scoring calls share the batch) logs every key with a positive finite value, and a scoring
call gathers only its new field: far fewer bytes than the batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from test_driver import ray_local, smoke_config  # noqa: F401  (ray_local is a fixture)

from agentrl.batch import TrainBatch
from agentrl.distributed.traffic import TRAFFIC, payload_nbytes
from agentrl.logging import read_jsonl
from agentrl.metrics_schema import (
    BYTES_IN,
    BYTES_OUT,
    GEN_TOKENS,
    GEN_TOKENS_PER_S,
    SAMPLES_PER_S,
    STEP_S,
    TRAIN_TOKENS,
    TRAIN_TOKENS_PER_S,
    StepCounts,
    step_metrics,
    timing_key,
)
from trainers.driver import Trainer

SCHEMA = [
    *(timing_key(p) for p in ("generate", "logprob", "adv", "update", "sync")),
    STEP_S,
    GEN_TOKENS,
    GEN_TOKENS_PER_S,
    TRAIN_TOKENS,
    TRAIN_TOKENS_PER_S,
    SAMPLES_PER_S,
    BYTES_OUT,
    BYTES_IN,
]


def test_rates_divide_counts_by_their_phase_and_skip_missing_times() -> None:
    timings = {timing_key("generate"): 2.0, timing_key("update"): 0.5}
    m = step_metrics(timings, step_s=4.0, counts=StepCounts(100, 30, 8))
    assert m[GEN_TOKENS_PER_S] == 50.0 and m[TRAIN_TOKENS_PER_S] == 60.0
    assert m[SAMPLES_PER_S] == 2.0 and m[STEP_S] == 4.0 and m[GEN_TOKENS] == 100.0
    bare = step_metrics({}, step_s=0.0, counts=StepCounts(100, 30, 8))
    assert not {GEN_TOKENS_PER_S, TRAIN_TOKENS_PER_S, SAMPLES_PER_S} & set(bare)


def test_a_run_logs_the_schema_and_scoring_returns_only_new_fields(
    tmp_path: Path,
    ray_local: None,  # noqa: F811
) -> None:
    cfg = smoke_config(
        tmp_path, "eval.num_samples=0", "checkpoint.every=0", "sft.steps=0", "algo.kl.coef=0.01"
    )
    trainer = Trainer(cfg)
    scoring: list[dict[str, Any]] = []
    score = trainer.score

    def traced(batch: TrainBatch) -> dict[str, float]:
        before = TRAFFIC.by_method()
        out = score(batch)
        delta = {
            m: (o - before.get(m, (0, 0))[0], i - before.get(m, (0, 0))[1])
            for m, (o, i) in TRAFFIC.by_method().items()
        }
        fields = {k: batch[k] for k in ("old_logprobs", "ref_logprobs")}
        scoring.append({"delta": delta, "batch": payload_nbytes(batch), "new": fields})
        return out

    trainer.score = traced  # type: ignore[method-assign]
    try:
        trainer.setup()
        trainer.step()
        trainer.step()
    finally:
        trainer.close()

    rows = read_jsonl(cfg.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in SCHEMA:
            assert key in row and math.isfinite(row[key]) and row[key] > 0, (key, row.get(key))
    for s in scoring:
        sent = sum(o for o, _ in s["delta"].values())
        got = sum(i for _, i in s["delta"].values())
        # the batch is put once for the actor and the reference model, not once per call
        assert 0 < sent <= s["batch"]
        # each call gathers one (B, T) float field: the two together weigh what they added
        assert got == sum(payload_nbytes(t) for t in s["new"].values())
        assert got < s["batch"] / 2
