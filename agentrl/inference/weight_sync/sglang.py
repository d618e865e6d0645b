"""SGLang's documented weight-update APIs: from disk, or an NCCL broadcast from the trainer.

mode="disk":        shards -> POST /update_weights_from_disk {"model_path", "weight_version"}
mode="distributed": once POST /init_weights_update_group (trainer = rank 0), then per bucket
                    POST /update_weights_from_distributed {"names", "dtypes", "shapes", ...}
                    while rank 0 broadcasts each tensor in that order
verify: /weights_checksum (embedded) or sampled rows through /get_weights_by_name (SGLang)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import torch

from agentrl.errors import ConfigError
from agentrl.inference.backends import make_dialect
from agentrl.inference.backends.base import call
from agentrl.inference.client import InferenceClient
from agentrl.inference.weight_sync.base import Named, ServerReport, WeightSyncConfig, buckets
from agentrl.inference.weight_sync.disk import DiskWeightSync


@dataclass(kw_only=True)
class SGLangSyncConfig(WeightSyncConfig):
    mode: str = "disk"
    """``disk`` (/update_weights_from_disk) or ``distributed`` (NCCL broadcast)."""
    master_address: str = "127.0.0.1"
    master_port: int = 29555
    group_name: str = "agentrl_weight_sync"
    backend: str = "nccl"
    ranks_per_server: int = 1
    """GPUs (tensor x pipeline ranks) of each SGLang server in the broadcast group."""
    sample_rows: int = 4
    """Rows of a few tensors kept to compare through /get_weights_by_name (real SGLang)."""


class SGLangWeightSync(DiskWeightSync):
    """SGLang's documented weight-update APIs.

    ``mode="disk"``: ``POST /update_weights_from_disk {"model_path", "weight_version"}`` (the
    embedded server implements it too; this path is tested against it).
    ``mode="distributed"``: once, ``POST /init_weights_update_group {"master_address",
    "master_port", "rank_offset", "world_size", "group_name", "backend"}`` while the trainer
    joins the same group as rank 0; then per bucket ``POST /update_weights_from_distributed
    {"names", "dtypes", "shapes", "group_name", "flush_cache", "weight_version"}`` while rank 0
    broadcasts each tensor in that order. Written against SGLang's documentation; it needs GPUs
    and a real SGLang server and has not been run here. A restarted server cannot rejoin an
    existing broadcast group: re-pushing to a subset of servers works in disk mode only.
    """

    Config = SGLangSyncConfig  # type: ignore[assignment]
    cfg: SGLangSyncConfig
    hash_ahead = False  # SGLang servers are checked by sampled values, not full checksums

    def __init__(self, client: InferenceClient, cfg: SGLangSyncConfig | None = None) -> None:
        super().__init__(client, cfg or SGLangSyncConfig())
        if self.cfg.mode not in ("disk", "distributed"):
            raise ConfigError(
                f"SGLangWeightSync mode must be disk or distributed, got {self.cfg.mode!r}."
            )
        self._group: Any = None  # torch ProcessGroupNCCL (rank 0 of the update group)
        self._samples: dict[str, torch.Tensor] = {}

    def _recording(self, named: Named) -> Iterator[tuple[str, torch.Tensor]]:
        self._samples = {}
        for name, t in super()._recording(named):
            if len(self._samples) < 3 and t.dim() >= 1 and "lm_head" not in name:
                self._samples[name] = t[: self.cfg.sample_rows].detach().float().cpu().clone()
            yield name, t

    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None:
        if self.cfg.mode == "disk":
            return await super()._send(named, version, targets)
        if sorted(targets) != sorted(self.client.urls):
            raise ConfigError(
                "SGLangWeightSync(mode='distributed') broadcasts to every server of its group; "
                "it cannot push to a subset (a restarted server): use mode='disk'."
            )
        if self._group is None:
            self._group = await self._init_group()
        urls = self.client.urls
        pending = None
        for bucket in buckets(named, self.cfg.bucket_bytes):
            if pending is not None:
                await self._one_bucket(urls, pending, version, last=False)
            pending = bucket
        if pending is not None:
            await self._one_bucket(urls, pending, version, last=True)

    async def _one_bucket(
        self, urls: list[str], bucket: list[tuple[str, torch.Tensor]], version: int, last: bool
    ) -> None:
        body: dict[str, object] = {
            "names": [n for n, _ in bucket],
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket], "group_name": self.cfg.group_name,
            "flush_cache": last}  # fmt: skip
        if last:
            body["weight_version"] = str(version)
        http, group = self.client.http, self._group

        def broadcast() -> None:
            for _, t in bucket:
                group.broadcast(t.cuda(), 0).wait()

        await asyncio.gather(
            *(call(http, "POST", u + "/update_weights_from_distributed", json=body) for u in urls),
            asyncio.to_thread(broadcast),
        )

    async def _init_group(self) -> Any:
        c, urls = self.cfg, self.client.urls
        world = 1 + len(urls) * c.ranks_per_server

        def join() -> Any:
            from torch.distributed import PrefixStore, ProcessGroupNCCL, TCPStore

            store = TCPStore(c.master_address, c.master_port, world, is_master=True)
            prefixed = PrefixStore(f"{c.group_name}/", store)
            return ProcessGroupNCCL(prefixed, 0, world, ProcessGroupNCCL.Options())

        posts = [call(self.client.http, "POST", u + "/init_weights_update_group", json={
            "master_address": c.master_address, "master_port": c.master_port,
            "rank_offset": 1 + i * c.ranks_per_server, "world_size": world,
            "group_name": c.group_name, "backend": c.backend}) for i, u in enumerate(urls)]  # fmt: skip
        group, *_ = await asyncio.gather(asyncio.to_thread(join), *posts)
        return group

    async def _verify_by_name(self, http: httpx2.AsyncClient, url: str) -> ServerReport:
        matched, bad = 0, []
        for name, rows in self._samples.items():
            got = await call(http, "POST", url + "/get_weights_by_name",
                             json={"name": name, "truncate_size": rows.shape[0]})  # fmt: skip
            served = torch.tensor(got, dtype=torch.float32).reshape(rows.shape)
            if torch.allclose(served, rows, atol=1e-2, rtol=1e-2):
                matched += 1
            else:
                bad.append(name)
        v = await make_dialect("sglang").weight_version(http, url)
        return ServerReport(matched=matched, mismatched=bad, unverifiable=0, version=v,
                            ok=matched > 0 and not bad and v == self.version)  # fmt: skip
