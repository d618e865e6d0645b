"""The static engine's captured decode steps: one CUDA graph per bucket, replayed per step.

    graphs = DecodeGraphs(step, state=(tok, pos, draw), slots=.., max_len=.., device=.., stats=..)
    tokens, logprobs, logp = graphs.replay(rows, key_len, filtering)  # captured on first use
    graphs.capture_all(filtering, warm_prefill)                       # or every one at start
    graphs.clear()                                                    # after new weight tensors

``step(rows, key_len, filtering)`` is ``StaticRunner._step``: one decode step over slots
[0, rows) that reads and advances the per-slot device tensors in ``state``. A graph records
it once for a (row bucket, length bucket, filtering) key (``buckets.graph_key``) and replays
it with whatever those tensors hold then; its outputs are the same tensors every replay.
GPU only: on CPU the runner calls ``step`` directly and never builds this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.inference.buckets import bucket_steps, decode_buckets, graph_key

logger = logging.getLogger(__name__)

StepOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Key = tuple[int, int, bool]


class DecodeGraphs:
    """Capture, keep and replay the decode step's CUDA graphs, with the time they cost."""

    def __init__(
        self,
        step: Callable[[int, int, bool], StepOut],
        *,
        state: tuple[torch.Tensor, ...],
        slots: int,
        max_len: int,
        device: torch.device,
        stats: dict[str, Any],
    ) -> None:
        self.step, self.state, self.stats = step, state, stats
        self.slots, self.max_len, self.device = slots, max_len, device
        self.graphs: dict[Key, tuple[Any, StepOut]] = {}
        self.capture_s = 0.0  # wall time capturing graphs (at start and inside decode steps)
        self.warmup_s = 0.0  # of which: the captures' eager warm-up steps
        self.start_s = 0.0  # wall time of ``capture_all`` (graphs and prefill warm-up)
        self.start_graphs = 0
        self.graph_mb = 0.0  # device memory the start's graphs hold
        self._pool: Any = None
        self._side: Any = None  # the stream captures warm up on

    def info(self) -> dict[str, Any]:
        return {
            "capture_s": self.capture_s,
            "graphs_at_start": self.start_graphs,
            "capture_at_start_s": self.start_s,
            "capture_warmup_s": self.warmup_s,
            "graph_memory_mb": self.graph_mb,
        }

    def clear(self) -> None:
        """Forget every graph (they read parameter tensors that were replaced)."""
        self.graphs.clear()

    def replay(self, rows: int, key_len: int, filtering: bool) -> StepOut:
        """The decode step from the graph of its buckets, captured first if it is new."""
        key = (*graph_key(rows, key_len, self.slots, self.max_len), filtering)
        entry = self.graphs.get(key)
        if entry is None:
            start = time.perf_counter()
            entry = self.graphs[key] = self._capture(*key)
            self.capture_s += time.perf_counter() - start
        graph, out = entry
        graph.replay()
        return out

    def capture_all(self, filtering: bool, warm_prefill: Callable[[], None]) -> int:
        """Capture every bucket ``replay`` can ask for (``decode_buckets``; with ``filtering``
        also their top-k/top-p variants) after ``warm_prefill``; returns how many were new.
        The warm-ups write into free slots: the caller zeroes its cache afterwards."""
        start = time.perf_counter()
        before = torch.cuda.memory_allocated(self.device)
        warm_prefill()
        keys = [
            (r, k, f)
            for f in ((False, True) if filtering else (False,))
            for r, k in decode_buckets(self.slots, self.max_len)
        ]
        todo = [key for key in keys if key not in self.graphs]
        logger.info(
            "capturing %d decode graphs (%d row buckets up to %d, %d length buckets up to %d%s)",
            len(todo),
            len(bucket_steps(self.slots)),
            self.slots,
            len(bucket_steps(self.max_len, length=True)),
            self.max_len,
            ", with and without top-k/top-p" if filtering else "",
        )
        last_log = start
        for i, key in enumerate(todo, 1):
            self.graphs[key] = self._capture(*key, log=False)
            now = time.perf_counter()
            if now - last_log > 5.0 or i == len(todo):
                logger.info("captured %d/%d decode graphs (%.1f s)", i, len(todo), now - start)
                last_log = now
        torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.capture_s += elapsed
        self.start_s += elapsed
        self.start_graphs += len(todo)
        self.graph_mb = (torch.cuda.memory_allocated(self.device) - before) / 2**20
        logger.info(
            "captured %d decode graphs at start in %.1f s (eager warm-up steps %.1f s); "
            "they hold %.0f MiB of device memory",
            len(todo),
            elapsed,
            self.warmup_s,
            self.graph_mb,
        )
        return len(todo)

    def _capture(self, rows: int, key_len: int, filtering: bool, log: bool = True) -> Any:
        """Capture ``step`` for these buckets. The warm-up runs do the real step once on the
        side stream, so the state they advance is put back before the capture."""
        saved = [t.clone() for t in self.state]
        if self._side is None:
            # one side stream for every capture: cuBLAS keeps a workspace per stream it runs
            # on (a new stream per capture held ~17 MiB each: 1 GiB for 63 graphs on an H200)
            self._side = torch.cuda.Stream()
        side = self._side
        start = time.perf_counter()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step(rows, key_len, filtering)
                for t, old in zip(self.state, saved, strict=True):
                    t.copy_(old)
        side.synchronize()
        self.warmup_s += time.perf_counter() - start
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.step(rows, key_len, filtering)
        self.stats["graphs_captured"] += 1  # the runner's counter: a re-capture counts again
        if log:
            logger.info("captured the decode step: %d rows, %d positions", rows, key_len)
        return graph, out
