"""vLLM's RL weight-transfer protocol, with agentrl's file engine or vLLM's NCCL engine.

    /pause?mode=keep (each target)
    agentrl_file:  /init_weight_transfer_engine {"root"} (once per server)
                   /start_weight_update
                   bucket i -> <root>/bucket-0000i.safetensors    (thread, trainer side)
                      || /update_weights {"path", "names"} of bucket i-1  (server side, overlapped)
                   /finish_weight_update {"weight_version"}
    nccl:          vLLM's trainer engine broadcasts, then /update_weight_version
    /resume

Where the time goes on one machine (``benchmarks/weight_sync.py`` prints the split): writing
a bucket is one kernel copy of each tensor's bytes into tmpfs (no serialization copy: the
header is built by hand and each tensor's memory goes to ``os.write`` as is); the server maps
the file (safetensors loads it without copying) and vLLM's layerwise reload copies it into
the model and repacks it for its kernels. Writing bucket i+1 overlaps the server loading
bucket i. Bucket files are kept and overwritten in place by the next push
(``Config.keep_files``): tmpfs pages that already exist are written about twice as fast as new
ones, at the cost of one copy of the weights in tmpfs. Checksums are not computed during the
push (see ``base.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends.base import call
from agentrl.inference.client import InferenceClient
from agentrl.inference.weight_sync.base import WeightSync, WeightSyncConfig, buckets, unique
from agentrl.inference.weight_sync.files import write_bucket

_BUCKET = "bucket-{:05d}.safetensors"


@dataclass(kw_only=True)
class VLLMSyncConfig(WeightSyncConfig):
    pause_mode: str | None = "keep"
    """``/pause?mode=`` around an update (keep: requests wait; abort); None: no pause."""
    keep_files: bool = True
    """Keep bucket files between pushes and overwrite them in place (faster; one copy of the
    weights stays in ``root``); False: delete each file once it is loaded."""
    master_address: str = "127.0.0.1"
    master_port: int = 29556
    ranks_per_server: int = 1


class VLLMWeightSync(WeightSync):
    """vLLM's RL weight-transfer protocol (``VLLM_SERVER_DEV_MODE=1``).

    ``agentrl_file`` (ran on CPU): each bucket is written as one safetensors file under
    ``Config.root`` and named in ``/update_weights``; the server's engine
    (``backends/vllm_engine.py``) loads it with a layerwise reload. ``nccl``: vLLM's own
    trainer engine (``WeightTransferTrainerFactory`` + ``HTTPVLLMWeightSyncClient``) broadcasts
    the tensors; written against vLLM's API, needs GPUs and vllm in the trainer, not run here.
    """

    Config = VLLMSyncConfig  # type: ignore[assignment]
    cfg: VLLMSyncConfig

    def __init__(self, client: InferenceClient, cfg: VLLMSyncConfig | None = None) -> None:
        super().__init__(client, cfg or VLLMSyncConfig())
        not_vllm = [u for u, b in client.backends.items() if b != "vllm"]
        if not_vllm:
            raise ConfigError(
                f"VLLMWeightSync needs vLLM servers; {not_vllm[0]} is not one "
                "(give its url as 'vllm+http://...')."
            )
        self._inited: set[str] = set()  # servers whose engine knows our root
        self._trainer_engine: Any = None  # vLLM's NCCLTrainerWeightTransferEngine

    def forget(self, url: str) -> None:
        self._inited.discard(url)

    async def close(self) -> None:
        """Remove the bucket files (also from a ``Config.root`` given by the user)."""
        if self.cfg.root:
            for f in Path(self.cfg.root).glob("bucket-*.safetensors"):
                f.unlink(missing_ok=True)
        await super().close()

    async def _each(self, urls: list[str], path: str, body: object = None) -> None:
        http = self.client.http
        await asyncio.gather(*(call(http, "POST", u + path, json=body) for u in urls))

    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None:
        urls, mode = list(targets), self.cfg.pause_mode
        if mode:
            await asyncio.gather(
                *(call(self.client.http, "POST", u + "/pause", params={"mode": mode}) for u in urls)
            )
        try:
            if self.cfg.vllm_engine == "nccl":
                await asyncio.to_thread(self._send_nccl, list(named), urls)
                await self._each(urls, "/update_weight_version", {"new_version": str(version)})
            else:
                await self._send_files(named, version, urls)
        finally:
            if mode:
                await self._each(urls, "/resume")

    async def _send_files(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, urls: list[str]
    ) -> None:
        root = self.root("agentrl-vllm-sync-")
        fresh = [u for u in urls if u not in self._inited]
        await self._each(fresh, "/init_weight_transfer_engine", {"init_info": {"root": str(root)}})
        self._inited.update(fresh)
        await self._each(urls, "/start_weight_update")
        pending: asyncio.Task[None] | None = None
        paths: list[Path] = []
        try:
            for i, bucket in enumerate(buckets(unique(named), self.cfg.bucket_bytes)):
                paths.append(root / _BUCKET.format(i))
                t0 = time.perf_counter()
                names = await asyncio.to_thread(write_bucket, paths[-1], bucket)
                self.times.write_s += time.perf_counter() - t0
                if pending is not None:
                    await pending  # the server loads one bucket at a time
                pending = asyncio.create_task(self._load(urls, paths[-1], names))
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            if not self.cfg.keep_files:
                for p in paths:
                    p.unlink(missing_ok=True)
        for stale in root.glob("bucket-*.safetensors"):  # a previous, larger layout
            if stale not in paths:
                stale.unlink(missing_ok=True)
        t0 = time.perf_counter()
        await self._each(urls, "/finish_weight_update", {"weight_version": str(version)})
        self.times.load_s += time.perf_counter() - t0

    async def _load(self, urls: list[str], path: Path, names: list[str]) -> None:
        t0 = time.perf_counter()
        try:
            await self._each(
                urls,
                "/update_weights",
                {"update_info": {"path": str(path), "names": sorted(names)}},
            )
        except InferenceError as exc:
            raise InferenceError(f"loading {path.name} ({len(names)} tensors): {exc}") from exc
        finally:
            self.times.load_s += time.perf_counter() - t0

    def _send_nccl(self, named: list[tuple[str, torch.Tensor]], urls: list[str]) -> None:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        class Source(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in named]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                return iter([(n, t.cuda()) for n, t in named])

        if len(urls) != 1:
            raise ConfigError("VLLMWeightSync(engine='nccl') drives one server per instance.")
        if self._trainer_engine is None or urls[0] not in self._inited:
            c = self.cfg
            info = NCCLTrainerInitInfo(
                master_address=c.master_address,
                master_port=c.master_port,
                world_size=1 + c.ranks_per_server,
                rank=0,
            )
            self._trainer_engine = WeightTransferTrainerFactory.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(urls[0]), source=Source()
            )
            self._inited.add(urls[0])
        self._trainer_engine.source = Source()
        self._trainer_engine.send_weights()
