"""Bytes the driver moves through the object store: what it puts out and what it gathers in.

    TRAFFIC.take()   # -> {"driver/bytes_out": ..., "driver/bytes_in": ...} since the last take

Every ``ray.put`` of the group layer (DP_SPLIT shards, broadcast arguments, ``Sharded.put``)
counts as *out*; every result fetched to the driver (``GroupFuture.result``,
``Sharded.gather``) counts as *in*. Refs handed from one group to the next
(``future.sharded()``) never reach the driver and count nothing.

The size is the payload's tensor bytes (each tensor's storage once, as torch pickles it) plus
the length of any ``str``/``bytes``; the small Python objects around them (row metadata, dict
keys) are walked but not weighed. It is cheap (no serialization) and exact for what dominates:
tensors. Counting is per driver process and per method (``by_method``), for tests and tuning.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["TRAFFIC", "DataTraffic", "payload_nbytes"]

_MAX_DEPTH = 6


def payload_nbytes(value: object) -> int:
    """Tensor (and str/bytes) bytes in ``value``, each tensor storage counted once."""
    seen: set[int] = set()
    return _walk(value, seen, 0)


def _walk(value: object, seen: set[int], depth: int) -> int:
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else id(value)
        if key in seen:
            return 0
        seen.add(key)
        return int(storage.nbytes())
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value)
    if value is None or isinstance(value, bool | int | float) or depth >= _MAX_DEPTH:
        return 0
    nbytes = getattr(value, "nbytes", None)  # numpy arrays
    if isinstance(nbytes, int) and not callable(nbytes):
        return nbytes
    items = _children(value)
    return sum(_walk(v, seen, depth + 1) for v in items)


def _children(value: object) -> list[Any]:
    if isinstance(value, Mapping):
        return list(value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    leaves = getattr(value, "values", None)
    if type(value).__name__ == "TensorDict" and callable(leaves):
        return list(leaves(include_nested=True, leaves_only=True))
    out: list[Any] = []
    for cls in type(value).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(value, name):
                out.append(getattr(value, name))
    out.extend(getattr(value, "__dict__", {}).values())
    return out


class DataTraffic:
    """Counters of the bytes the driver puts out and gathers in, by method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.out: Counter[str] = Counter()
        self.into: Counter[str] = Counter()

    def sent(self, method: str, value: object) -> None:
        n = payload_nbytes(value)
        with self._lock:
            self.out[method] += n

    def received(self, method: str, value: object) -> None:
        n = payload_nbytes(value)
        with self._lock:
            self.into[method] += n

    def totals(self) -> dict[str, float]:
        """``driver/bytes_out`` and ``driver/bytes_in`` since the last ``take``."""
        with self._lock:
            return {
                "driver/bytes_out": float(sum(self.out.values())),
                "driver/bytes_in": float(sum(self.into.values())),
            }

    def by_method(self) -> dict[str, tuple[int, int]]:
        """``{method: (bytes_out, bytes_in)}`` since the last ``take``."""
        with self._lock:
            names = sorted(set(self.out) | set(self.into))
            return {m: (self.out[m], self.into[m]) for m in names}

    def take(self) -> dict[str, float]:
        """``totals()``, then start counting from zero."""
        out = self.totals()
        with self._lock:
            self.out.clear()
            self.into.clear()
        return out


TRAFFIC = DataTraffic()
"""The driver process's counters (worker processes never put or gather through the group)."""
