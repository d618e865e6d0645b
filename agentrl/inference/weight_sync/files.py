"""Safetensors files written with one copy: each tensor's memory goes to ``os.write`` as is.

    [(name, tensor), ...] -> header (JSON, built by hand) -> os.write(header)
        -> os.write(tensor bytes) per tensor (wider dtypes first: aligned) -> ftruncate

``safetensors.torch.save_file`` first copies every tensor into a bytes object; writing the
tensors' own memory skips that copy. The file is overwritten in place (not unlinked), so tmpfs
pages it already has are reused, which is about twice as fast as allocating new ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from agentrl.inference.weights import SAFETENSORS_DTYPES


def write_bucket(path: Path, bucket: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Write one safetensors file, overwriting ``path`` in place; returns the names written.

    Each tensor's bytes go from its own memory to the file (one copy); wider dtypes come
    first so every tensor starts aligned to its element size."""
    tensors = [(n, t.detach().to("cpu").contiguous()) for n, t in bucket]
    if any(t.dtype not in SAFETENSORS_DTYPES for _, t in tensors):
        from safetensors.torch import save_file

        save_file(dict(tensors), str(path))
        return [n for n, _ in tensors]
    tensors.sort(key=lambda nt: -nt[1].element_size())
    header: dict[str, object] = {}
    offset = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}  # fmt: skip
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        _write_all(fd, memoryview(len(head).to_bytes(8, "little") + head))
        for _, t in tensors:
            if t.numel():
                _write_all(fd, t.reshape(-1).view(torch.uint8).numpy().data)
        os.ftruncate(fd, 8 + len(head) + offset)
    finally:
        os.close(fd)
    return [n for n, _ in tensors]


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]
