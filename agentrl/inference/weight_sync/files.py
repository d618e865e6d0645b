"""Safetensors files written with one copy: each tensor's memory goes to ``os.write`` as is.

    [(name, tensor), ...] -> header (JSON, built by hand) -> os.write(header)
        -> os.write(tensor bytes) per tensor (wider dtypes first: aligned) -> ftruncate

``safetensors.torch.save_file`` first copies every tensor into a bytes object; writing the
tensors' own memory skips that copy. The file is overwritten in place (not unlinked), so tmpfs
pages it already has are reused, which is about twice as fast as allocating new ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from agentrl.inference.weights import safetensors_parts


def write_bucket(path: Path, bucket: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Write one safetensors file, overwriting ``path`` in place; returns the names written.

    Each tensor's bytes go from its own memory to the file (one copy); wider dtypes come
    first so every tensor starts aligned to its element size."""
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in bucket}
    parts = safetensors_parts(tensors)
    if parts is None:
        from safetensors.torch import save_file

        save_file(tensors, str(path))
        return list(tensors)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for part in parts:
            _write_all(fd, memoryview(part))
        os.ftruncate(fd, sum(len(p) for p in parts))  # uint8 views: len is bytes
    finally:
        os.close(fd)
    return list(tensors)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]
