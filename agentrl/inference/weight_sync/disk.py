"""Weight syncs through files and through HTTP bodies (embedded server, SGLang, vLLM).

    DiskWeightSync:       shards -> root/v{version}/model-NNNNN.safetensors
                          -> embedded/SGLang: /update_weights_from_disk {"model_path"}
                          -> vLLM + agentrl_file engine: one weight-transfer round naming the shards
                          -> vLLM otherwise: /collective_rpc reload_weights + /update_weight_version
    HTTPTensorWeightSync: safetensors buckets, streamed from the tensors' memory
                          -> /update_weights_from_tensor?flush=0 ... flush=1

The served version's shard directory is kept (a restarted server reloads from it) and the
previous one removed; ``close()`` removes a temporary root.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import httpx2
import torch

from agentrl.errors import InferenceError
from agentrl.inference.backends import make_dialect
from agentrl.inference.backends.base import call, error_message
from agentrl.inference.client import InferenceClient
from agentrl.inference.weight_sync.base import WeightSync, WeightSyncConfig, buckets, unique
from agentrl.inference.weight_sync.files import write_bucket
from agentrl.inference.weights import safetensors_bucket_parts


def write_shards(named: Iterable[tuple[str, torch.Tensor]], out: Path, bucket_bytes: int) -> int:
    """Write tensors as ``model-NNNNN.safetensors`` shards (tied aliases once, each tensor's
    bytes copied once, straight into the file); returns the count."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for n, bucket in enumerate(buckets(unique(named), bucket_bytes), start=1):
        write_bucket(out / f"model-{n:05d}.safetensors", bucket)
    return n


class DiskWeightSync(WeightSync):
    """Save the weights as safetensors shards, then ask every server to reload from that dir.

    Embedded and SGLang servers get ``/update_weights_from_disk``. vLLM servers running the
    ``agentrl_file`` engine get one weight-transfer round naming the shards; others get
    ``/collective_rpc reload_weights(weights_path)`` and ``/update_weight_version`` (on vLLM's
    CPU backend that path leaves a tied LM head's packed copy stale: use the engine there).
    The directory must be readable by the servers (same machine or a shared filesystem).
    """

    def __init__(self, client: InferenceClient, cfg: WeightSyncConfig | None = None) -> None:
        super().__init__(client, cfg)
        self._vllm_roots: set[tuple[str, Path]] = set()

    def forget(self, url: str) -> None:
        self._vllm_roots = {(u, r) for u, r in self._vllm_roots if u != url}

    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None:
        root = self.root("agentrl-weights-")
        out = root / f"v{version}"
        t0 = time.perf_counter()
        await asyncio.to_thread(write_shards, named, out, self.cfg.bucket_bytes)
        t1 = time.perf_counter()
        files = sorted(out.glob("*.safetensors"))
        http = self.client.http

        async def one(url: str, backend: str) -> None:
            if backend == "vllm" and self.cfg.vllm_engine == "agentrl_file":
                await self._vllm_files(url, root, files, version)
            else:
                await make_dialect(backend).load_from_disk(http, url, str(out), version)

        await asyncio.gather(*(one(u, b) for u, b in targets.items()))
        self.times.write_s, self.times.load_s = t1 - t0, time.perf_counter() - t1
        for old in root.glob("v*"):
            if old != out and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)

    async def _vllm_files(self, url: str, root: Path, files: list[Path], version: int) -> None:
        """One round of vLLM's weight-transfer protocol with the agentrl_file engine."""
        http = self.client.http
        if (url, root) not in self._vllm_roots:
            await call(
                http,
                "POST",
                url + "/init_weight_transfer_engine",
                json={"init_info": {"root": str(root)}},
            )
            self._vllm_roots.add((url, root))
        await call(http, "POST", url + "/start_weight_update")
        for f in files:
            await call(
                http, "POST", url + "/update_weights", json={"update_info": {"path": str(f)}}
            )
        await call(
            http, "POST", url + "/finish_weight_update", json={"weight_version": str(version)}
        )


_OCTETS = {"content-type": "application/octet-stream"}


class HTTPTensorWeightSync(WeightSync):
    """Safetensors buckets over HTTP to the embedded server (``/update_weights_from_tensor``):
    every bucket is staged (``flush=0``), then one empty ``flush=1`` applies them all between
    two decode steps and sets the version."""

    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None:
        http, urls = self.client.http, list(targets)
        for url, backend in targets.items():
            if backend != "sglang":
                raise InferenceError(
                    f"HTTPTensorWeightSync needs the embedded server; {url} is a {backend} "
                    "server (use DiskWeightSync or VLLMWeightSync there)."
                )
        t0, posting = time.perf_counter(), 0.0
        for parts in safetensors_bucket_parts(named, self.cfg.bucket_bytes):
            t1 = time.perf_counter()
            await asyncio.gather(*(_post(http, u, parts, {"flush": "0"}) for u in urls))
            posting += time.perf_counter() - t1
        t1 = time.perf_counter()
        params = {"flush": "1", "weight_version": str(version)}
        await asyncio.gather(*(_post(http, u, [], params) for u in urls))
        self.times.load_s = posting + time.perf_counter() - t1
        self.times.write_s = t1 - t0 - posting


_CHUNK = 4 << 20  # bytes per piece handed to httpx2 (each is copied once into the socket)


async def _pieces(parts: list[bytes | memoryview]) -> AsyncIterator[bytes]:
    """A bucket's header and tensor memory in pieces of at most ``_CHUNK`` bytes, uncopied
    (memoryviews, which httpx2 passes on to h11 like bytes)."""
    for part in parts:
        view = memoryview(part).cast("B")
        for i in range(0, view.nbytes, _CHUNK):
            yield view[i : i + _CHUNK]  # type: ignore[misc]


async def _post(
    http: httpx2.AsyncClient, url: str, parts: list[bytes | memoryview], params: dict[str, str]
) -> None:
    """POST one bucket, streamed from the tensors' memory with its Content-Length (the server
    receives it into one buffer of that size)."""
    path = url + "/update_weights_from_tensor"
    size = sum(memoryview(p).nbytes for p in parts)
    headers = {**_OCTETS, "content-length": str(size)}
    try:
        resp = await http.post(path, content=_pieces(parts), headers=headers, params=params)
    except httpx2.TransportError as exc:
        raise InferenceError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise InferenceError(f"POST {path} -> {resp.status_code}: {error_message(resp)}")
