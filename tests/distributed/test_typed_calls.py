"""Group calls name the Worker method, so mypy checks their arguments and return types.

The driver calls its groups as ``group.call(ActorWorker.compute_logprobs, ...)`` and
``group.call_sharded(...)``; a wrong argument there must fail the type check (CI runs mypy), not
only the run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]

HEADER = """
from agentrl.batch import BatchFields, TrainBatch
from agentrl.distributed import WorkerGroup
from trainers.workers import ActorWorker, CriticWorker

def scoring(actor: WorkerGroup[ActorWorker], critic: WorkerGroup[CriticWorker], batch: TrainBatch) -> None:
"""


def check(body: str, tmp_path: Path) -> tuple[str, int]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(HEADER + textwrap.indent(textwrap.dedent(body), "    "))
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            str(snippet),
        ]
    )
    return out + err, status


def test_correct_calls_type_check(tmp_path: Path) -> None:
    out, status = check(
        """
        fields: BatchFields = actor.call(ActorWorker.compute_logprobs, batch, 1.0)
        shards = actor.shard(batch)
        fields = actor.call_sharded(ActorWorker.compute_logprobs, shards, temperature=0.7)
        values: BatchFields = critic.call_sharded(CriticWorker.compute_values, shards)
        weights: dict = actor.call(ActorWorker.named_weights)
        saved: list[None] = actor.call(ActorWorker.save, "/tmp/x")
        """,
        tmp_path,
    )
    assert status == 0, out


WRONG = [
    (
        'actor.call(ActorWorker.compute_logprobs, "not a batch")',
        'Argument 2 to "call" of "WorkerGroup" has incompatible type "str"; expected "TrainBatch"',
    ),
    (
        'actor.call_sharded(ActorWorker.compute_logprobs, actor.shard(batch), "hot")',
        'incompatible type "str"; expected "float"',
    ),
    (
        "actor.call_sharded(ActorWorker.compute_logprobs, actor.shard([1, 2]))",
        'Argument 1 to "call_sharded" of "WorkerGroup" has incompatible type',
    ),
    (
        "critic.call(ActorWorker.compute_logprobs, batch)",  # a method of another Worker
        'Argument 1 to "call" of "WorkerGroup" has incompatible type',
    ),
    (
        "x: TrainBatch = actor.call(ActorWorker.compute_logprobs, batch)",  # only new fields
        'Incompatible types in assignment (expression has type "BatchFields"',
    ),
]


def test_each_wrong_call_fails_the_type_check(tmp_path: Path) -> None:
    out, status = check("\n".join(body for body, _ in WRONG), tmp_path)
    assert status == 1, out
    first = HEADER.count("\n") + 1  # the line of the first call in snippet.py
    for line, (body, error) in enumerate(WRONG, start=first):
        found = [ln for ln in out.splitlines() if f"snippet.py:{line}: error:" in ln]
        assert any(error in ln for ln in found), f"{body!r} (line {line}):\n{out}"
