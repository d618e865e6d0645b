"""SGLang's documented weight-update APIs: from disk, or a broadcast from the trainer.

mode="disk":        shards -> POST /update_weights_from_disk {"model_path", "weight_version"}
mode="distributed": once POST /init_weights_update_group (trainer = rank 0, its own process
                    group: server_collective.join_update_group), then per bucket
                    POST /update_weights_from_distributed {"names", "dtypes", "shapes", ...}
                    while rank 0 broadcasts each tensor in that order (gloo: CPU tensors;
                    nccl: CUDA tensors)
verify: /weights_checksum (embedded) or sampled rows through /get_weights_by_name (SGLang)

What ran: both modes against the embedded server, the distributed one over gloo on CPU
(tests/inference/test_weight_sync_distributed.py: one and two servers, several buckets).
Written against SGLang's documentation and not run here: nccl, and either mode with a real
SGLang server. The trainer lays out its store keys as torch's ``_new_process_group_helper``
does, which is how SGLang joins (``init_custom_process_group``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import httpx2
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends import make_dialect
from agentrl.inference.backends.base import call
from agentrl.inference.client import InferenceClient
from agentrl.inference.server_collective import UpdateGroup, join_update_group
from agentrl.inference.weight_sync.base import (
    Named,
    ServerReport,
    Targets,
    WeightSyncConfig,
    buckets,
)
from agentrl.inference.weight_sync.disk import DiskWeightSync
from agentrl.sockets import listen_socket

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SGLangSyncConfig(WeightSyncConfig):
    mode: str = "disk"
    """``disk`` (/update_weights_from_disk) or ``distributed`` (a broadcast from the trainer)."""
    master_address: str = "127.0.0.1"
    """Where the trainer serves the group's store; servers must reach it."""
    master_port: int = 29555
    """The store's port; 0: one the OS picks (sent to the servers with each group's init)."""
    group_name: str = "agentrl_weight_sync"
    backend: str = "nccl"
    """``nccl`` (CUDA tensors; SGLang on GPUs) or ``gloo`` (CPU tensors; the embedded server
    on CPU)."""
    group_timeout_s: float = 600.0
    """Longest wait for the servers to join, and for each broadcast."""
    ranks_per_server: int = 1
    """GPUs (tensor x pipeline ranks) of each SGLang server in the broadcast group."""
    sample_rows: int = 4
    """Rows of a few tensors kept to compare through /get_weights_by_name (real SGLang)."""


class SGLangWeightSync(DiskWeightSync):
    """SGLang's documented weight-update APIs.

    ``mode="disk"``: ``POST /update_weights_from_disk {"model_path", "weight_version"}``.
    ``mode="distributed"``: once, ``POST /init_weights_update_group {"master_address",
    "master_port", "rank_offset", "world_size", "group_name", "backend"}`` while the trainer
    joins the same group as rank 0 (it serves the group's TCPStore on ``master_address``);
    then per bucket ``POST /update_weights_from_distributed {"names", "dtypes", "shapes",
    "group_name", "flush_cache", "weight_version"}`` while rank 0 broadcasts each tensor in
    that order; the last bucket carries the version. A failed bucket drops the group (the next
    push initialises a new one, which replaces the servers' group of that name); ``close()``
    destroys it on the servers. Both modes ran against the embedded server (distributed: over
    gloo on CPU); nccl and a real SGLang server have not been run here. A restarted server
    cannot rejoin an existing broadcast group: re-pushing to a subset of servers works in disk
    mode only.
    """

    Config = SGLangSyncConfig  # type: ignore[assignment]
    cfg: SGLangSyncConfig
    hash_ahead = False  # until each target showed /weights_checksum (``verify``)

    def __init__(self, client: InferenceClient, cfg: SGLangSyncConfig | None = None) -> None:
        super().__init__(client, cfg or SGLangSyncConfig())
        if self.cfg.mode not in ("disk", "distributed"):
            raise ConfigError(
                f"SGLangWeightSync mode must be disk or distributed, got {self.cfg.mode!r}."
            )
        self._group: UpdateGroup | None = None  # rank 0 of the update group (distributed)
        self._checksums: dict[str, bool] = {}  # url -> serves /weights_checksum (embedded)
        self._samples: dict[str, torch.Tensor] = {}

    def forget(self, url: str) -> None:
        super().forget(url)
        self._checksums.pop(url, None)
        self._drop_group()  # a restarted server left the group: re-initialise on next push

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
        pending = None
        for bucket in buckets(named, self.cfg.bucket_bytes):
            if pending is not None:
                await self._one_bucket(self._group, pending, version, last=False)
            pending = bucket
        if pending is not None:
            await self._one_bucket(self._group, pending, version, last=True)

    async def _one_bucket(
        self, group: UpdateGroup, bucket: list[tuple[str, torch.Tensor]], version: int, last: bool
    ) -> None:
        body: dict[str, object] = {
            "names": [n for n, _ in bucket],
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket],
            "group_name": self.cfg.group_name,
            "flush_cache": last,
        }
        if last:
            body["weight_version"] = str(version)
        urls, http, nccl = self.client.urls, self.client.http, self.cfg.backend == "nccl"

        def broadcast() -> None:  # reads group.pg: a closed group's store (and port) is freed
            for _, t in bucket:
                sent = t.cuda() if nccl else t.detach().cpu()
                group.pg.broadcast(sent.contiguous(), 0).wait()

        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(call(http, "POST", u + "/update_weights_from_distributed", json=body) for u in urls),
            asyncio.to_thread(broadcast),
            return_exceptions=True,
        )
        self.times.load_s += time.perf_counter() - t0
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            # Some rank may be out of step: start a fresh group on the next push (a server
            # replaces its group of the same name on init).
            self._drop_group()
            raise failed[0]

    async def _init_group(self) -> UpdateGroup:
        c, urls = self.cfg, self.client.urls
        if c.backend not in ("nccl", "gloo"):
            raise ConfigError(f"SGLangSyncConfig.backend must be nccl or gloo, got {c.backend!r}.")
        if c.backend == "nccl" and not torch.cuda.is_available():
            raise ConfigError(
                "backend nccl broadcasts CUDA tensors and this trainer has no "
                "GPU; use backend='gloo' (CPU) or mode='disk'."
            )
        world = 1 + len(urls) * c.ranks_per_server
        sock = listen_socket(
            c.master_address, c.master_port, purpose="the weights update group (set master_port)"
        )
        port = int(sock.getsockname()[1])  # master_port 0: the one the OS picked
        join = partial(
            join_update_group,
            address=c.master_address,
            port=port,
            rank=0,
            world_size=world,
            group_name=c.group_name,
            backend=c.backend,
            timeout_s=c.group_timeout_s,
            listen_fd=sock.detach(),
        )
        posts = [
            call(
                self.client.http,
                "POST",
                u + "/init_weights_update_group",
                json={
                    "master_address": c.master_address,
                    "master_port": port,
                    "rank_offset": 1 + i * c.ranks_per_server,
                    "world_size": world,
                    "group_name": c.group_name,
                    "backend": c.backend,
                },
            )
            for i, u in enumerate(urls)
        ]
        joined = asyncio.ensure_future(asyncio.to_thread(join))
        try:
            await asyncio.gather(*posts)
        except BaseException:
            # A server refused: ours waits for it until group_timeout_s; answer now and close
            # the group if it ever forms.
            joined.add_done_callback(_close_late)
            raise
        return await joined

    def _drop_group(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

    async def close(self) -> None:
        """Leave the update group (servers destroy theirs) and remove temp files."""
        if self._group is not None:
            body = {"group_name": self.cfg.group_name}
            for url in self.client.urls:
                try:
                    await call(
                        self.client.http,
                        "POST",
                        url + "/destroy_weights_update_group",
                        json=body,
                        timeout=10.0,
                    )
                except InferenceError as exc:
                    logger.warning("destroying the update group on %s failed: %s", url, exc)
            self._drop_group()
        await super().close()

    async def verify(self, *, targets: Targets | None = None) -> bool:
        # Hash ahead only where every target showed /weights_checksum before (embedded
        # servers); real SGLang is checked by sampled rows, not by hashing the whole model.
        goal = self.targets(targets)
        self.hash_ahead = bool(goal) and all(self._checksums.get(u) for u in goal)
        return await super().verify(targets=targets)

    async def _verify_sglang(self, http: httpx2.AsyncClient, url: str) -> ServerReport:
        got = await super()._verify_sglang(http, url)
        self._checksums.setdefault(url, True)  # _verify_by_name set False for real SGLang
        return got

    async def _verify_by_name(self, http: httpx2.AsyncClient, url: str) -> ServerReport:
        self._checksums[url] = False
        matched, bad = 0, []
        for name, rows in self._samples.items():
            got = await call(
                http,
                "POST",
                url + "/get_weights_by_name",
                json={"name": name, "truncate_size": rows.shape[0]},
            )
            served = torch.tensor(got, dtype=torch.float32).reshape(rows.shape)
            if torch.allclose(served, rows, atol=1e-2, rtol=1e-2):
                matched += 1
            else:
                bad.append(name)
        v = await make_dialect("sglang").weight_version(http, url)
        return ServerReport(
            matched=matched,
            mismatched=bad,
            unverifiable=0,
            version=v,
            ok=matched > 0 and not bad and v == self.version,
        )


def _close_late(fut: asyncio.Future[UpdateGroup]) -> None:
    """Close a group that formed after its push had failed (or drop its error)."""
    if fut.cancelled():
        return
    if fut.exception() is None:
        fut.result().close()
