"""Weights through shared memory to embedded servers on the trainer's machine.

    trainer tensors -> buckets (safetensors layout) copied into one memfd of this process
        -> POST /update_weights_from_ipc {"path": "/proc/PID/fd/N", "buckets": [[off, len]...]}
        -> server: map the file read-only, check names/shapes/completeness, copy every tensor
           into its parameters between two decode steps, set the version, drop the mapping

Each tensor is copied twice in all: into the shared buffer, then into the served parameters.
With ``Config.eager_checksums`` and ``Config.checksum="sum64"`` each tensor is summed right
after its copy, while it is still in the CPU's last-level cache (a 0.5B model's largest tensor
is 11.5 MB), instead of in a pass of its own. By default the sums wait for ``verify``, which
computes them while the server computes its own: on a loaded 2-core machine summing during
the write made the write 2-3x slower in some runs and gained nothing overall in others
(``benchmarks/weight_sync.py --paths ipc ipc-eager``).
The memfd has no name in /dev/shm or anywhere else: it lives as long as this sync holds it
open (``close()``, or the trainer process exiting), so nothing is left behind after a crash.
It is kept between pushes, so later pushes write into pages that are already mapped (about
four times faster than new ones); it therefore holds one copy of the model (its serving
dtype) while the sync lives. The server reads it through ``/proc/PID/fd/N``, which needs the
same machine, user and pid namespace; elsewhere use HTTPTensorWeightSync or DiskWeightSync.
One push at a time: a push rewrites (and may resize) the buffer a server maps.

On GPUs the same protocol would carry CUDA IPC handles of device buckets
(``cudaIpcGetMemHandle``, as torch.multiprocessing shares CUDA tensors) instead of a file
path, and the server would copy device to device; this version stages through host memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import time
from collections.abc import Iterator

import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends.base import call
from agentrl.inference.client import InferenceClient
from agentrl.inference.weight_sync.base import WeightSync, WeightSyncConfig, buckets, unique
from agentrl.inference.weights import safetensors_parts, sum64_digest, word_sum

_ALIGN = 64  # every bucket starts on a cache line (its tensors are aligned inside it)


class IPCWeightSync(WeightSync):
    """Buckets in a memfd of the trainer's process; each embedded server on this machine maps
    it and copies the tensors into its parameters (``/update_weights_from_ipc``)."""

    def __init__(self, client: InferenceClient, cfg: WeightSyncConfig | None = None) -> None:
        super().__init__(client, cfg)
        if not hasattr(os, "memfd_create"):
            raise ConfigError(
                "IPCWeightSync needs Linux (os.memfd_create); use HTTPTensorWeightSync or "
                "DiskWeightSync on this platform."
            )
        self._fd: int | None = None
        self._map: mmap.mmap | None = None

    @property
    def path(self) -> str | None:
        """The shared buffer as servers open it (None before the first push)."""
        return None if self._fd is None else f"/proc/{os.getpid()}/fd/{self._fd}"

    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None:
        for url, backend in targets.items():
            if backend != "sglang":
                raise InferenceError(
                    f"IPCWeightSync needs the embedded server; {url} is a {backend} server "
                    "(use DiskWeightSync or VLLMWeightSync there)."
                )
        t0 = time.perf_counter()
        spans = await asyncio.to_thread(self._write, named)
        t1 = time.perf_counter()
        body = {"path": self.path, "buckets": spans, "weight_version": version}
        http = self.client.http
        await asyncio.gather(
            *(call(http, "POST", u + "/update_weights_from_ipc", json=body) for u in targets)
        )
        self.times.write_s, self.times.load_s = t1 - t0, time.perf_counter() - t1

    def _write(self, named: Iterator[tuple[str, torch.Tensor]]) -> list[tuple[int, int]]:
        """Copy every bucket into the shared buffer; returns each one's (offset, length)."""
        layout: list[tuple[list[bytes | memoryview], int, int]] = []
        by_ptr: dict[int, str | None] = {}  # a tensor's address -> its name (None: ambiguous)
        offset = 0
        for bucket in buckets(unique(named), self.cfg.bucket_bytes):
            tensors = {n: t.detach().to("cpu").contiguous() for n, t in bucket}
            parts = safetensors_parts(tensors)
            if parts is None:
                from safetensors.torch import save

                parts = [save(tensors)]
            for tname, t in tensors.items():
                by_ptr[t.data_ptr()] = None if t.data_ptr() in by_ptr else tname
            length = sum(memoryview(p).nbytes for p in parts)
            layout.append((parts, offset, length))
            offset += length + (-length % _ALIGN)
        buf = self._buffer(max(offset, _ALIGN))  # mmap refuses an empty file
        summing = self.cfg.eager_checksums and self._sums.kind == "sum64"
        for parts, start, _ in layout:
            for part in parts:
                n = memoryview(part).nbytes
                if isinstance(part, bytes):  # a header (or a library-written blob)
                    buf[start : start + n] = part
                elif n:
                    src = torch.frombuffer(part, dtype=torch.uint8)
                    dst = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=start)
                    dst.copy_(src)  # torch copies large tensors on all its threads
                    name = by_ptr.get(src.data_ptr()) if summing else None
                    if name is not None:  # summed while src is still in cache
                        self._sums.put(name, sum64_digest(n, word_sum(src)))
                start += n
        return [(start, length) for _, start, length in layout]

    def _buffer(self, size: int) -> mmap.mmap:
        """The memfd mapped writable, resized to ``size`` bytes (pages kept when it fits)."""
        if self._fd is None:
            self._fd = os.memfd_create("agentrl-weights", os.MFD_CLOEXEC)
        if self._map is not None and len(self._map) == size:
            return self._map
        self._unmap()
        os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)
        return self._map

    def _unmap(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still exists: it goes with that
                self._map.close()
            self._map = None

    async def close(self) -> None:
        """Free the shared buffer (servers hold no mapping between pushes)."""
        self._unmap()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        await super().close()
