"""Worker classes used by the distributed tests (importable by the Ray worker processes)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray

from agentrl.batch import BatchFields, TrainBatch
from agentrl.distributed import DataLayout, Dispatch, Worker, dispatch


@dataclass
class Chunk:
    """A small splittable value: split(n) gives n contiguous parts; concat joins them."""

    values: list[int]

    def split(self, n: int) -> list[Chunk]:
        k, extra = divmod(len(self.values), n)
        out, start = [], 0
        for i in range(n):
            stop = start + k + (1 if i < extra else 0)
            out.append(Chunk(self.values[start:stop]))
            start = stop
        return out

    @classmethod
    def concat(cls, parts: Sequence[Chunk]) -> Chunk:
        return cls([v for p in parts for v in p.values])


def _rebuild_tracked(values: list[int], log: str) -> Tracked:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return Tracked(values, log)


class Tracked:
    """A splittable list of ints that appends the pid of every process deserialising it to ``log``."""

    def __init__(self, values: list[int], log: str) -> None:
        self.values = values
        self.log = log

    def __reduce__(self) -> tuple[object, tuple[list[int], str]]:
        return (_rebuild_tracked, (self.values, self.log))

    def split(self, n: int) -> list[Tracked]:
        return [Tracked(c.values, self.log) for c in Chunk(self.values).split(n)]

    @classmethod
    def concat(cls, parts: Sequence[Tracked]) -> Tracked:
        return cls([v for p in parts for v in p.values], parts[0].log)


class EchoWorker(Worker):
    def __init__(self, offset: int = 0, join_collective: bool = True) -> None:
        if join_collective:
            self.init_process_group(timeout_s=60)
        self.offset = offset
        self.unblock = threading.Event()

    @dispatch(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict[str, object]:
        ctx = self.context
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "env_rank": os.environ["RANK"],
            "master_addr": os.environ["MASTER_ADDR"],
            "master_port": os.environ["MASTER_PORT"],
            "backend": ctx.backend,
            "resources": ray.get_runtime_context().get_assigned_resources(),
            "placement_group": ray.get_runtime_context().get_placement_group_id(),
        }

    @dispatch(Dispatch.ONE_TO_ALL)
    def add(self, x: int, *, scale: int = 1) -> int:
        return (x + self.offset + self.rank) * scale

    @dispatch(Dispatch.DP_SPLIT)
    def shard_of(self, items: list[int], tag: str = "") -> list[tuple[int, list[int], str]]:
        return [(self.rank, items, tag)]

    @dispatch(Dispatch.DP_SPLIT)
    def double(self, chunk: Chunk) -> Chunk:
        return Chunk([2 * v for v in chunk.values])

    @dispatch(Dispatch.DP_SPLIT)
    def make_tracked(self, items: list[int], log: str) -> Tracked:
        return Tracked([v * 10 for v in items], log)

    @dispatch(Dispatch.DP_SPLIT)
    def sum_tracked(self, chunk: Tracked) -> list[int]:
        return [sum(chunk.values)]

    @dispatch(Dispatch.RANK0)
    def rank_and_pid(self) -> tuple[int, int]:
        return self.rank, os.getpid()

    @dispatch(Dispatch.ALL_TO_ALL)
    def scaled(self, x: int, factor: int) -> int:
        return x * factor

    @dispatch(Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value + self.rank], device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    @dispatch(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"boom on rank {rank}")
        return self.rank

    @dispatch(Dispatch.ONE_TO_ALL)
    def wait_for_file(self, path: str) -> bool:
        while not Path(path).exists():
            threading.Event().wait(0.05)
        return True

    def not_exposed(self) -> None:
        pass


class FailingInitWorker(Worker):
    def __init__(self, bad_rank: int) -> None:
        if self.rank == bad_rank:
            raise RuntimeError(f"cannot build rank {self.rank}")

    @dispatch(Dispatch.ONE_TO_ALL)
    def ok(self) -> bool:
        return True


class ModelParallelWorker(Worker):
    """Ranks in model-parallel groups of ``mp`` (like tensor parallelism): one shard per group."""

    def __init__(self, mp: int, bad_layout: bool = False) -> None:
        self.mp = mp
        self.bad_layout = bad_layout

    def data_parallel_layout(self) -> DataLayout:
        collect = self.bad_layout or self.rank % self.mp == 0  # bad: every rank collects
        return DataLayout(self.rank // self.mp, self.world_size // self.mp, collect=collect)

    @dispatch(Dispatch.DP_SPLIT)
    def owned(self, chunk: Chunk) -> list[tuple[int, list[int]]]:
        """(this rank, the values it got)."""
        return [(self.rank, chunk.values)]

    @dispatch(Dispatch.DP_SPLIT)
    def doubled(self, chunk: Chunk) -> Chunk:
        return Chunk([2 * v for v in chunk.values])


class RowScoreWorker(Worker):
    """Scores TrainBatch rows like a model would: one new (B, T) field back, not the batch."""

    @dispatch(Dispatch.DP_SPLIT)
    def token_scores(self, batch: TrainBatch, scale: float = 1.0) -> BatchFields:
        return BatchFields({"scores": batch.input_ids.float() * scale})

    @dispatch(Dispatch.DP_SPLIT)
    def echo(self, batch: TrainBatch) -> TrainBatch:
        return batch
