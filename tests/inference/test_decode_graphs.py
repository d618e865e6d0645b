"""DecodeGraphs' bookkeeping on CPU, with torch.cuda's graph and stream calls faked: which
bucket captures, when a graph is reused or captured again, what the warm-up leaves behind.
The real captures run in tests/inference/test_static_cuda.py (a GPU only)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentrl.inference.buckets import decode_buckets, graph_key
from agentrl.inference.decode_graphs import DecodeGraphs


class FakeGraph:
    """A graph whose capture runs the step eagerly (real capture only records it) and whose
    replay counts."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class FakeStream:
    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def nothing(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    for name, value in {
        "CUDAGraph": FakeGraph,
        "Stream": FakeStream,
        "current_stream": FakeStream,
        "stream": nothing,
        "graph": nothing,
        "graph_pool_handle": lambda: object(),
        "memory_allocated": lambda device=None: 0,
        "synchronize": lambda device=None: None,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)


def test_graphs_are_captured_once_per_bucket_and_again_after_clear(fake_cuda: None) -> None:
    tok = torch.zeros(8, dtype=torch.long)
    calls: list[tuple[int, int, bool]] = []

    def step(rows: int, key_len: int, filtering: bool) -> tuple[torch.Tensor, ...]:
        calls.append((rows, key_len, filtering))
        tok[:rows] += 1
        return tok[:rows], tok.float(), tok.float()

    stats = {"graphs_captured": 0}
    g = DecodeGraphs(
        step, state=(tok,), slots=8, max_len=256, device=torch.device("cpu"), stats=stats
    )

    out = g.replay(3, 40, False)
    key = (*graph_key(3, 40, 8, 256), False)
    assert stats["graphs_captured"] == 1 and list(g.graphs) == [key]
    # captured for the bucket, not the exact shape: two warm-ups and the capture's own run
    assert calls == [(key[0], key[1], False)] * 3
    # the warm-ups' state was put back: only the (fake) capture's run advanced it
    assert tok[: key[0]].tolist() == [1] * key[0]
    graph, captured = g.graphs[key]
    assert out is captured and graph.replays == 1

    g.replay(key[0], key[1] - 1, False)  # the same bucket: replayed, not captured
    assert stats["graphs_captured"] == 1 and graph.replays == 2 and len(calls) == 3
    g.replay(3, 40, True)  # top-k/top-p sampling is a graph of its own
    assert stats["graphs_captured"] == 2
    g.clear()  # new parameter tensors: every graph is stale
    g.replay(3, 40, False)
    assert stats["graphs_captured"] == 3 and len(g.graphs) == 1
    assert g.info()["capture_s"] > 0 and g.info()["graphs_at_start"] == 0


def test_capture_all_captures_every_bucket_a_step_can_ask_for_after_the_warm_up(
    fake_cuda: None,
) -> None:
    tok = torch.zeros(8, dtype=torch.long)

    def step(rows: int, key_len: int, filtering: bool) -> tuple[torch.Tensor, ...]:
        return tok[:rows], tok.float(), tok.float()

    stats = {"graphs_captured": 0}
    g = DecodeGraphs(
        step, state=(tok,), slots=8, max_len=256, device=torch.device("cpu"), stats=stats
    )
    g.replay(1, 10, False)  # one captured in traffic already: not captured again
    warmed: list[int] = []
    n = g.capture_all(True, lambda: warmed.append(1))
    want = {(r, k, f) for f in (False, True) for r, k in decode_buckets(8, 256)}
    assert set(g.graphs) == want and n == len(want) - 1 and warmed == [1]
    assert stats["graphs_captured"] == len(want)
    assert g.info()["graphs_at_start"] == n and g.info()["capture_at_start_s"] > 0
