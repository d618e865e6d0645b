"""Dispatch rules without Ray: splitting, gathering, the decorator, a Worker outside a group."""

import pytest
from distributed_workers import Chunk, EchoWorker

from agentrl.distributed import Dispatch, DispatchedMethod, Worker, dispatch
from agentrl.distributed.dispatch import (
    concat_results,
    dispatched_methods,
    is_splittable,
    split_sequence,
    split_value,
)
from agentrl.errors import ConfigError, TrainingError


def test_list_split_is_contiguous_and_balanced() -> None:
    assert split_value([1, 2, 3, 4, 5], 2, "t") == [[1, 2, 3], [4, 5]]
    assert split_value([1], 3, "t") == [[1], [], []]
    assert concat_results(split_value(list(range(7)), 3, "t"), "t") == list(range(7))


def test_splittable_object_round_trips() -> None:
    chunk = Chunk([1, 2, 3, 4, 5])
    assert is_splittable(chunk) and is_splittable([1]) and not is_splittable((1, 2))
    parts = split_value(chunk, 2, "t")
    assert parts == [Chunk([1, 2, 3]), Chunk([4, 5])]
    assert concat_results(parts, "t") == chunk


class _BadSplit(Chunk):
    def split(self, n: int) -> list[Chunk]:  # parts of size n, the classic mistake
        return [Chunk(self.values[i : i + n]) for i in range(0, len(self.values), n)]


def test_split_with_wrong_part_count_says_n_parts() -> None:
    with pytest.raises(TrainingError, match=r"split\(2\) returned 3 parts, expected 2"):
        split_value(_BadSplit([1, 2, 3, 4, 5, 6]), 2, "t")


def test_concat_rules() -> None:
    assert concat_results([None, None], "t") is None
    with pytest.raises(TrainingError, match="return \\[value\\]"):
        concat_results([1, 2], "t")
    with pytest.raises(TrainingError, match="some ranks returned a list"):
        concat_results([[1], 2], "t")


def test_all_to_all_needs_one_item_per_rank() -> None:
    assert split_sequence([1, 2], 2, "t") == [1, 2]
    with pytest.raises(ConfigError, match="expected 2, got 3"):
        split_sequence([1, 2, 3], 2, "t")
    with pytest.raises(ConfigError, match="must be a list"):
        split_sequence(5, 2, "t")


def test_decorator_records_mode_and_keeps_local_calls() -> None:
    assert isinstance(EchoWorker.__dict__["double"], DispatchedMethod)
    methods = dispatched_methods(EchoWorker)
    assert methods["double"].mode is Dispatch.DP_SPLIT
    assert methods["rank_and_pid"].mode is Dispatch.RANK0
    assert "not_exposed" not in methods
    with pytest.raises(ConfigError, match=r"Dispatch\.DP_SPLIT"):
        dispatch("dp")  # type: ignore[call-overload]


class _Sub(EchoWorker):
    @dispatch(Dispatch.ONE_TO_ALL)
    def extra(self) -> int:
        return self.add(1)  # a dispatched method called locally is a plain call


def test_worker_outside_a_group_is_rank_zero_of_one() -> None:
    w = _Sub(offset=2, join_collective=False)
    assert (w.rank, w.world_size, w.context.backend) == (0, 1, "gloo")
    assert w.extra() == 3
    assert w.double(Chunk([1])) == Chunk([2])
    assert dispatched_methods(_Sub)["add"].mode is Dispatch.ONE_TO_ALL
    assert isinstance(w, Worker)
