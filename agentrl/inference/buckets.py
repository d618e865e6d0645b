"""Sizing and bucketing of the static engine's slot KV cache and decode graphs (pure functions).

    cache_shape(cfg, model, dtype) -> (slots, max_len)       from kv_cache_gb and max_seq_len
    graph_key(rows, key_len, slots, max_len) -> (rows bucket, attended-length bucket)
    decode_buckets(slots, max_len) -> every key graph_key can give (captured up front)

A decode step over ``rows`` running requests is padded to a power-of-two row bucket and
attends a length bucket (two per doubling), so a few shapes cover all traffic and each
replays as one CUDA graph (``static_runner.py``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.inference.decoder import SlotCache
from agentrl.inference.runner import ModelRunner

MIN_KEY_BUCKET = 64
CAPTURE_MODES = ("eager", "lazy", "all")
"""``capture_graphs``: eager captures every (rows, length) bucket's decode graph at start (for
sampling without top-k/top-p; the filtering variants on first use), all also the filtering
variants, lazy each graph on first use."""
DEFAULT_MAX_LEN = 8192
"""Tokens per slot unless ``max_seq_len`` says otherwise (a longer prompt gets a 400)."""


def cache_shape(cfg: ModelRunner.Config, model: Any, dtype: torch.dtype) -> tuple[int, int]:
    """(slots, max_len) for a config: ``max_len`` = ``max_seq_len`` (default: the model's
    context, at most ``DEFAULT_MAX_LEN``); as many slots (up to ``max_batch_size``) as
    ``kv_cache_gb`` holds."""
    context = int(getattr(model.config, "max_position_embeddings", 0) or DEFAULT_MAX_LEN)
    max_len = min(cfg.max_seq_len or DEFAULT_MAX_LEN, context)
    per_token = SlotCache.bytes_per_token(model, dtype)
    budget = cfg.kv_cache_gb * 2**30 if cfg.kv_cache_gb > 0 else _default_budget(cfg.device)
    slots = min(cfg.max_batch_size, int(budget // (per_token * max_len)))
    if slots < 1:
        need = per_token * max_len / 2**30
        raise ConfigError(
            f"kv_cache_gb={budget / 2**30:.2f} does not hold one request of {max_len} tokens "
            f"({need:.2f} GiB); raise --kv-cache-gb or lower --max-seq-len."
        )
    return slots, max_len


def _default_budget(device: str) -> float:
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return 0.6 * free
    return 0.25 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _bucket(n: int, cap: int, floor: int = 1) -> int:
    """The smallest power of two >= n (and >= floor), at most cap."""
    b = floor
    while b < n:
        b *= 2
    return min(b, cap)


def _key_bucket(n: int, cap: int) -> int:
    """Attended length for ``n`` positions: the smallest of 64, 96, 128, 192, 256, 384, ...
    (two buckets per doubling) that is >= n, at most cap. Attention reads every position of
    the bucket for every row, so finer buckets than powers of two save bytes on long tails."""
    b = MIN_KEY_BUCKET
    while b < n:
        b = b * 3 // 2 if b & (b - 1) == 0 else b // 3 * 4
    return min(b, cap)


def graph_key(rows: int, key_len: int, slots: int, max_len: int) -> tuple[int, int]:
    """The (rows bucket, attended-length bucket) of a decode step over ``rows`` running
    requests attending ``key_len`` positions, in a cache of ``slots`` x ``max_len``."""
    return _bucket(rows, slots), _key_bucket(key_len, max_len)


def decode_buckets(slots: int, max_len: int) -> list[tuple[int, int]]:
    """Every (rows bucket, attended-length bucket) ``graph_key`` can give for this cache:
    the graphs a server captures up front with ``capture_graphs`` eager."""
    return [(r, k) for r in bucket_steps(slots) for k in bucket_steps(max_len, length=True)]


def bucket_steps(cap: int, length: bool = False) -> list[int]:
    """Every row bucket up to ``cap`` slots (``length``: every attended-length bucket up to
    ``cap`` positions), in order."""
    return _steps(_key_bucket if length else _bucket, cap)


def _steps(bucket: Any, cap: int) -> list[int]:
    """The values of ``bucket(n, cap)`` for n = 1 .. cap, in order (each bucket's successor
    is the bucket of one more than it)."""
    out = [bucket(1, cap)]
    while out[-1] < cap:
        out.append(bucket(out[-1] + 1, cap))
    return out
