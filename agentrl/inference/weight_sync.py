"""Push a trainer's weights to inference servers, bucketed and versioned, and verify them.

    trainer named tensors --push(named, version)--> [checksums recorded as they stream past]
        DiskWeightSync        safetensors shards in a dir -> each server reloads from disk
        HTTPTensorWeightSync  safetensors buckets over HTTP  (embedded server)
        SGLangWeightSync      /update_weights_from_disk, or /init_weights_update_group +
                              /update_weights_from_distributed (NCCL broadcast)
        VLLMWeightSync        /init_weight_transfer_engine, /start_weight_update,
                              /update_weights per bucket, /finish_weight_update {weight_version}
    verify() -> every server's checksums (and weight version) == the trainer's -> bool

Every implementation is used the same way (``await sync.push(model.state_dict().items(), v)``
then ``await sync.verify()``); ``last_report`` says what was compared. Checksums are SHA-256
of the raw bytes in the serving dtype (``Config.dtype``), computed by ``weights.py`` on both
sides. vLLM names fused parameters differently (``qkv_proj``); ``VLLMDigests`` maps the
trainer's names. vLLM's CPU backend drops the unpacked copy of linear weights after packing
them for oneDNN, so those report the digest of an empty tensor: they are counted as
``unverifiable``, and ``verify`` passes when every tensor that can be compared matches.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends import make_dialect
from agentrl.inference.backends.base import call
from agentrl.inference.backends.vllm import VLLMDialect, VLLMDigests, vllm_weight_digests
from agentrl.inference.client import InferenceClient
from agentrl.inference.weights import safetensors_buckets, tensor_checksum

logger = logging.getLogger(__name__)

EMPTY_DIGEST = tensor_checksum(torch.empty(0))
Named = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerReport:
    """What ``verify`` compared on one server."""

    matched: int
    mismatched: list[str]
    unverifiable: int  # tensors the server cannot show (packed on vLLM CPU)
    version: int
    ok: bool


@dataclass(kw_only=True)
class WeightSyncConfig:
    bucket_bytes: int = 256 << 20
    """Bytes per bucket (file, HTTP body or update call)."""
    dtype: str | None = None
    """Serving dtype, for checksums (``bfloat16``...); None: the tensors' own dtype."""
    root: str | None = None
    """Directory for weight files (disk and file engines); a temp dir (tmpfs if any) when None."""
    vllm_engine: str = "agentrl_file"
    """How vLLM servers take weights: the weight-transfer engine they run
    (``--weight-transfer-config``): ``agentrl_file`` (files; CPU or GPU, same machine) or
    ``nccl`` (GPUs). DiskWeightSync with another engine uses ``reload_weights`` over
    ``/collective_rpc`` instead."""


class WeightSync(ABC):
    """Sends weights to every server of an ``InferenceClient`` and checks they arrived."""

    Config = WeightSyncConfig

    def __init__(self, client: InferenceClient, cfg: WeightSyncConfig | None = None) -> None:
        self.client = client
        self.cfg = cfg or WeightSyncConfig()
        self._dtype = getattr(torch, self.cfg.dtype) if self.cfg.dtype else None
        self.version: int | None = None
        self.last_report: dict[str, ServerReport] = {}
        self._sums: dict[str, str] = {}
        self._vllm: VLLMDigests | None = None
        self._vllm_roots: set[tuple[str, Path]] = set()

    async def push(self, named_tensors: Named, version: int) -> None:
        """Send every tensor; afterwards each server serves ``version``."""
        self._sums, self._vllm = {}, VLLMDigests(self._dtype)
        await self._send(self._recording(named_tensors), version)
        self.version = version

    @abstractmethod
    async def _send(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None: ...

    def _recording(self, named: Named) -> Iterator[tuple[str, torch.Tensor]]:
        items = named.items() if isinstance(named, Mapping) else named
        for name, tensor in items:
            t = tensor if self._dtype is None else tensor.to(self._dtype)
            self._sums[name] = tensor_checksum(t)
            if self._vllm is not None:
                self._vllm.add(name, t)
            yield name, t

    async def _vllm_files(self, url: str, root: Path, files: list[Path], version: int) -> None:
        """One round of vLLM's weight-transfer protocol with the agentrl_file engine."""
        http = self.client.http
        if (url, root) not in self._vllm_roots:
            await call(http, "POST", url + "/init_weight_transfer_engine",
                       json={"init_info": {"root": str(root)}})  # fmt: skip
            self._vllm_roots.add((url, root))
        await call(http, "POST", url + "/start_weight_update")
        for f in files:
            await call(
                http, "POST", url + "/update_weights", json={"update_info": {"path": str(f)}}
            )
        await call(
            http, "POST", url + "/finish_weight_update", json={"weight_version": str(version)}
        )

    async def verify(self) -> bool:
        """True when every server holds the last pushed weights and version."""
        if self.version is None:
            raise ConfigError("verify() before push(): nothing to compare with.")
        http, backends = self.client.http, self.client.backends

        async def one(url: str) -> ServerReport:
            if backends[url] == "vllm":
                return await self._verify_vllm(http, url)
            return await self._verify_sglang(http, url)

        reports = await asyncio.gather(*(one(u) for u in backends))
        self.last_report = dict(zip(backends, reports, strict=True))
        for url, r in self.last_report.items():
            logger.info("weight check %s: %s", url, r)
        return all(r.ok for r in reports)

    async def _verify_sglang(self, http: httpx.AsyncClient, url: str) -> ServerReport:
        resp = await http.get(url + "/weights_checksum", params={"per_tensor": 1})
        if resp.status_code == 404:  # a real SGLang server: compare sampled values
            return await self._verify_by_name(http, url)
        if resp.status_code != 200:
            raise InferenceError(f"{url}/weights_checksum -> {resp.status_code}: {resp.text[:300]}")
        served = resp.json()["tensors"]
        return _report(served, self._sums, _version(resp.json()), self.version)

    async def _verify_by_name(self, http: httpx.AsyncClient, url: str) -> ServerReport:
        raise InferenceError(
            f"{url} has no /weights_checksum; use SGLangWeightSync, which keeps value samples "
            "and compares them through SGLang's /get_weights_by_name."
        )

    async def _verify_vllm(self, http: httpx.AsyncClient, url: str) -> ServerReport:
        assert self._vllm is not None
        served = await vllm_weight_digests(http, url)
        version = await VLLMDialect().weight_version(http, url)
        return _report(served, self._vllm.digests, version, self.version)


def _version(body: dict[str, object]) -> int:
    v = body.get("weight_version", 0)
    return v if isinstance(v, int) else int(str(v)) if str(v).isdigit() else 0


def _report(
    served: Mapping[str, str], expected: Mapping[str, str], version: int, want: int | None
) -> ServerReport:
    matched, bad, blind = 0, [], 0
    for name, digest in served.items():
        exp = expected.get(name)
        if exp is None:
            bad.append(name)  # the server has a tensor the trainer never sent
        elif digest == exp:
            matched += 1
        elif digest == EMPTY_DIGEST:
            blind += 1
        else:
            bad.append(name)
    ok = matched > 0 and not bad and version == want
    return ServerReport(matched=matched, mismatched=bad, unverifiable=blind, version=version, ok=ok)


def _weights_root(cfg: WeightSyncConfig, prefix: str) -> Path:
    if cfg.root:
        Path(cfg.root).mkdir(parents=True, exist_ok=True)
        return Path(cfg.root)
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None))


def write_shards(named: Iterable[tuple[str, torch.Tensor]], out: Path, bucket_bytes: int) -> int:
    """Write tensors as ``model-NNNNN.safetensors`` shards (tied aliases once); returns count."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for n, blob in enumerate(safetensors_buckets(named, bucket_bytes), start=1):
        (out / f"model-{n:05d}.safetensors").write_bytes(blob)
    return n


class DiskWeightSync(WeightSync):
    """Save the weights as safetensors shards, then ask every server to reload from that dir.

    Embedded and SGLang servers get ``/update_weights_from_disk``. vLLM servers running the
    ``agentrl_file`` engine get one weight-transfer round naming the shards; others get
    ``/collective_rpc reload_weights(weights_path)`` and ``/update_weight_version`` (on vLLM's
    CPU backend that path leaves a tied LM head's packed copy stale: use the engine there).
    The directory must be readable by the servers (same machine or a shared filesystem). The
    previous version's directory is removed once the new one is served.
    """

    async def _send(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        root = _weights_root(self.cfg, "agentrl-weights-")
        out = root / f"v{version}"
        await asyncio.to_thread(write_shards, named, out, self.cfg.bucket_bytes)
        files = sorted(out.glob("*.safetensors"))
        http = self.client.http

        async def one(url: str, backend: str) -> None:
            if backend == "vllm" and self.cfg.vllm_engine == "agentrl_file":
                await self._vllm_files(url, root.resolve(), files, version)
            else:
                await make_dialect(backend).load_from_disk(http, url, str(out), version)

        await asyncio.gather(*(one(u, b) for u, b in self.client.backends.items()))
        for old in root.glob("v*"):
            if old != out and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)


class HTTPTensorWeightSync(WeightSync):
    """Safetensors buckets over HTTP to the embedded server (``/update_weights_from_tensor``)."""

    async def _send(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        await self.client.update_weights_from_tensors(
            named, version, bucket_bytes=self.cfg.bucket_bytes
        )


def _buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


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
    and a real SGLang server and has not been run here.
    """

    Config = SGLangSyncConfig  # type: ignore[assignment]
    cfg: SGLangSyncConfig

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

    async def _send(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        if self.cfg.mode == "disk":
            return await super()._send(named, version)
        if self._group is None:
            self._group = await self._init_group()
        urls = self.client.urls
        pending = None
        for bucket in _buckets(named, self.cfg.bucket_bytes):
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

    async def _verify_by_name(self, http: httpx.AsyncClient, url: str) -> ServerReport:
        matched, bad = 0, []
        for name, rows in self._samples.items():
            got = await call(http, "POST", url + "/get_weights_by_name",
                             json={"name": name, "truncate_size": rows.shape[0]})  # fmt: skip
            served = torch.tensor(got, dtype=torch.float32).reshape(rows.shape)
            if torch.allclose(served, rows, atol=1e-2, rtol=1e-2):
                matched += 1
            else:
                bad.append(name)
        version = await self.client.weight_versions()
        v = version[url]
        return ServerReport(matched=matched, mismatched=bad, unverifiable=0, version=v,
                            ok=matched > 0 and not bad and v == self.version)  # fmt: skip


@dataclass(kw_only=True)
class VLLMSyncConfig(WeightSyncConfig):
    pause_mode: str | None = "keep"
    """``/pause?mode=`` around an update (keep: requests wait; abort); None: no pause."""
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
            raise ConfigError(f"VLLMWeightSync needs vLLM servers; {not_vllm[0]} is not one "
                              "(give its url as 'vllm+http://...').")  # fmt: skip
        self._root: Path | None = None
        self._trainer_engine: Any = None  # vLLM's NCCLTrainerWeightTransferEngine

    async def _each(self, path: str, body: object = None) -> None:
        http = self.client.http
        await asyncio.gather(*(call(http, "POST", u + path, json=body) for u in self.client.urls))

    async def _send(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        mode = self.cfg.pause_mode
        if mode:
            await asyncio.gather(*(call(self.client.http, "POST", u + "/pause",
                                        params={"mode": mode}) for u in self.client.urls))  # fmt: skip
        try:
            if self.cfg.vllm_engine == "nccl":
                await asyncio.to_thread(self._send_nccl, list(named))
                await self._each("/update_weight_version", {"new_version": str(version)})
            else:
                await self._send_files(named, version)
        finally:
            if mode:
                await self._each("/resume")

    async def _send_files(self, named: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        from safetensors.torch import save_file

        if self._root is None:
            self._root = _weights_root(self.cfg, "agentrl-vllm-sync-").resolve()
            await self._each(
                "/init_weight_transfer_engine", {"init_info": {"root": str(self._root)}}
            )
        await self._each("/start_weight_update")
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for i, bucket in enumerate(_buckets(named, self.cfg.bucket_bytes)):
            tensors = {}
            for name, t in bucket:  # a tied alias (lm_head = embed_tokens) goes once
                key = (t.data_ptr(), tuple(t.shape))
                if t.numel() and key in seen:
                    continue
                seen.add(key)
                tensors[name] = t.detach().to("cpu").contiguous()
            path = self._root / f"v{version}-{i:05d}.safetensors"
            await asyncio.to_thread(save_file, tensors, str(path))
            try:
                await self._each("/update_weights",
                                 {"update_info": {"path": str(path), "names": sorted(tensors)}})  # fmt: skip
            finally:
                path.unlink(missing_ok=True)
        await self._each("/finish_weight_update", {"weight_version": str(version)})

    def _send_nccl(self, named: list[tuple[str, torch.Tensor]]) -> None:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        class Source(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in named]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                return iter([(n, t.cuda()) for n, t in named])

        if len(self.client.urls) != 1:
            raise ConfigError("VLLMWeightSync(engine='nccl') drives one server per instance.")
        if self._trainer_engine is None:
            c = self.cfg
            info = NCCLTrainerInitInfo(master_address=c.master_address, master_port=c.master_port,
                                       world_size=1 + c.ranks_per_server, rank=0)  # fmt: skip
            self._trainer_engine = WeightTransferTrainerFactory.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(self.client.urls[0]), source=Source()
            )
        self._trainer_engine.source = Source()
        self._trainer_engine.send_weights()
