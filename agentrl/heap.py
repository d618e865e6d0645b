"""Garbage-collector pauses in long-running processes (the inference server, the driver).

Python's cyclic collector stops every thread of the process while it runs. A full (oldest
generation) pass walks every tracked object, and a process that imported torch, transformers
and FastAPI and built a model holds 400-500 thousand of them: one pass took 277 ms on the GPU
machine's host, in the middle of a 64-request round of ``benchmarks/generation.py`` whose
decode steps took 0.38 s (the round took 0.82 s; 0.45 s with the collector off). Those objects
live as long as the process, so walking them finds nothing to free.

``freeze()`` runs one collection and then moves every surviving object to the permanent
generation (``gc.freeze``), so later passes walk only what the process made since: requests,
results, caches. Call it once, after start-up work and before serving (the inference server,
trainer workers and rollout workers do; the driver, which may run inside someone else's
process, holds it with ``frozen()`` for its steps only); ``AGENTRL_GC_FREEZE=0`` in the
environment turns it off, to compare or to rule it out. ``pauses()`` reports
how long the collector has held the process since ``watch()`` (per generation), for
``/get_server_info`` and the metrics.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_started: list[float] = []
_totals: dict[int, list[float]] = {}  # generation -> [passes, seconds, longest seconds]
# gc.get_freeze_count() walks the permanent generation (~6 ms for 500,000 objects, the GIL
# held): counted once per freeze() here, not at every /metrics scrape.
_frozen_count = [0]


def freeze() -> int:
    """Collect once, then exempt every object alive now from later passes; returns how many
    objects are frozen in all. With ``AGENTRL_GC_FREEZE=0`` it freezes nothing."""
    if os.environ.get("AGENTRL_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()
    _frozen_count[0] = gc.get_freeze_count()
    return _frozen_count[0]


@contextlib.contextmanager
def frozen() -> Iterator[int]:
    """``freeze()`` for the ``with`` block, then ``gc.unfreeze()``: for code that runs inside
    a process it does not own (a training run called from a test or a notebook), so what the
    block's objects leave behind is collectable again afterwards."""
    count = freeze()
    try:
        yield count
    finally:
        if os.environ.get("AGENTRL_GC_FREEZE", "1") != "0":
            gc.unfreeze()
            _frozen_count[0] = gc.get_freeze_count()


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.perf_counter())
        return
    if not _started:  # watch() was called during a pass
        return
    took = time.perf_counter() - _started.pop()
    with _lock:
        row = _totals.setdefault(int(info["generation"]), [0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += took
        row[2] = max(row[2], took)


def watch() -> None:
    """Start timing the collector's passes in this process (idempotent)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def pauses() -> dict[str, float]:
    """``gc_gen{N}_passes``, ``gc_gen{N}_s`` and ``gc_gen{N}_max_s`` per generation since
    ``watch()``, and ``gc_frozen_objects`` (as counted by the last ``freeze()``)."""
    out: dict[str, float] = {"gc_frozen_objects": float(_frozen_count[0])}
    with _lock:
        for gen in range(3):
            passes, seconds, longest = _totals.get(gen, [0.0, 0.0, 0.0])
            out[f"gc_gen{gen}_passes"] = passes
            out[f"gc_gen{gen}_s"] = seconds
            out[f"gc_gen{gen}_max_s"] = longest
    return out
