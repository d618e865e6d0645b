"""The WeightSync interface: push named tensors to servers, then verify what they serve.

    push(named, version, targets=None)
        -> _recording: cast to the serving dtype, keep a reference per name (no hashing yet)
        -> _send(named, version, targets) (a subclass: files, HTTP, NCCL ...)
    verify(targets=None)
        -> each server's checksums (+ weight version) -> hash the trainer's side only for the
           names the server can show -> ServerReport per url (``last_report``)

``targets`` ({url: dialect name}) limits a push or a check to some servers, e.g. one server
that was restarted and must get the current weights before it is routed to again; None means
every server the client routes to. Checksums cover the raw bytes in the serving dtype
(``Config.dtype``): against embedded servers ``Config.checksum`` (``sum64`` by default, a
64-bit word sum at memory bandwidth that detects any single changed element; ``sha256``),
against vLLM SHA-256 (what its ``/weight_checker`` computes). They are computed when
``verify`` needs them, and only for tensors the server reports:
on vLLM's CPU backend the packed linear weights report an empty digest and are never hashed.
The pushed tensors are therefore kept (references; cast copies when the dtype changes) until
the next push; ``eager_checksums`` hashes during the push instead and keeps only the digests
(``IPCWeightSync`` then sums each tensor right after copying it, while it is in cache).
Embedded servers show every tensor, so against them the trainer hashes what is left while the
server computes its checksums (``hash_ahead``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx2
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends.vllm import VLLMDialect, VLLMDigests, vllm_weight_digests
from agentrl.inference.client import InferenceClient
from agentrl.inference.weights import ChecksumKind, tensor_checksum

logger = logging.getLogger(__name__)

EMPTY_DIGEST = tensor_checksum(torch.empty(0))
Named = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
Targets = Mapping[str, str]
"""Server url -> dialect name (``sglang`` for embedded/SGLang, ``vllm``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerReport:
    """What ``verify`` compared on one server."""

    matched: int
    mismatched: list[str]
    unverifiable: int  # tensors the server cannot show (packed on vLLM CPU)
    version: int
    ok: bool


@dataclass(kw_only=True, slots=True)
class SyncTimes:
    """Seconds spent by the last push and verify. Writing and loading overlap where a sync
    pipelines buckets, so ``write_s + load_s`` can exceed ``push_s``."""

    push_s: float = 0.0
    """Wall time of ``push`` (trainer tensors -> every target serves the version)."""
    write_s: float = 0.0
    """Serializing buckets (files, HTTP bodies) on the trainer's side."""
    load_s: float = 0.0
    """Waiting for the servers' load calls."""
    verify_s: float = 0.0
    """Wall time of ``verify``."""
    hash_s: float = 0.0
    """Part of ``verify_s``: hashing the trainer's tensors."""


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
    checksum: ChecksumKind = "sum64"
    """What ``verify`` compares with embedded servers (``/weights_checksum?kind=``): ``sum64``,
    64-bit words summed modulo 2**64 (one pass at memory bandwidth; any single changed
    element changes it, changes that cancel do not), or ``sha256`` (a cryptographic hash,
    ~20x slower). vLLM servers are always compared by SHA-256."""
    eager_checksums: bool = False
    """Hash every tensor during ``push`` (and drop the tensors) instead of at ``verify``."""
    hash_threads: int = 2
    """Threads hashing the trainer's tensors with SHA-256 (hashlib releases the GIL); ``sum64``
    runs one tensor at a time on all of torch's threads."""


class Digests(Protocol):
    """Expected digests by served name, computed on first ``get``."""

    def add(self, name: str, tensor: torch.Tensor) -> None: ...
    def get(self, name: str) -> str | None: ...
    def __contains__(self, name: object) -> bool: ...


class NamedDigests:
    """Digests (``kind``) under the trainer's own names (embedded server, SGLang)."""

    def __init__(self, kind: ChecksumKind = "sha256") -> None:
        self.kind: ChecksumKind = kind
        self._tensors: dict[str, torch.Tensor] = {}
        self._digests: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._tensors[name] = tensor.detach()
        self._digests.pop(name, None)

    def put(self, name: str, digest: str) -> None:
        """A digest computed elsewhere (e.g. while copying the tensor's bytes)."""
        self._digests[name] = digest

    def get(self, name: str) -> str | None:
        digest = self._digests.get(name)
        if digest is None and name in self._tensors:
            digest = self._digests[name] = tensor_checksum(self._tensors[name], self.kind)
        return digest

    def __contains__(self, name: object) -> bool:
        return name in self._tensors or name in self._digests

    def names(self) -> list[str]:
        """Names not hashed yet."""
        return [n for n in self._tensors if n not in self._digests]

    def freeze(self) -> None:
        """Hash everything now and drop the tensors."""
        for name in self._tensors:
            self.get(name)
        self._tensors.clear()


class WeightSync(ABC):
    """Sends weights to every server of an ``InferenceClient`` and checks they arrived."""

    Config = WeightSyncConfig
    hash_ahead = True
    """Hash the trainer's tensors while embedded servers compute their checksums (False where
    verify compares something else, e.g. SGLang's sampled values)."""

    def __init__(self, client: InferenceClient, cfg: WeightSyncConfig | None = None) -> None:
        self.client = client
        self.cfg = cfg or WeightSyncConfig()
        self._dtype = getattr(torch, self.cfg.dtype) if self.cfg.dtype else None
        self.version: int | None = None
        self.last_report: dict[str, ServerReport] = {}
        self.times = SyncTimes()
        self._sums = NamedDigests(self.cfg.checksum)
        self._vllm = VLLMDigests(self._dtype)
        self._temp_root: Path | None = None
        self._ahead: asyncio.Future[None] | None = None

    def targets(self, targets: Targets | None = None) -> dict[str, str]:
        """The servers a push or verify goes to (default: every server the client routes to)."""
        return dict(self.client.backends if targets is None else targets)

    async def push(
        self, named_tensors: Named, version: int, *, targets: Targets | None = None
    ) -> None:
        """Send every tensor; afterwards each target serves ``version``."""
        self._sums, self._vllm = NamedDigests(self.cfg.checksum), VLLMDigests(self._dtype)
        self.times = SyncTimes()
        t0 = time.perf_counter()
        goal = self.targets(targets)
        await self._send(self._recording(named_tensors), version, goal)
        self.version = version
        if self.cfg.eager_checksums:
            await asyncio.to_thread(self._freeze, set(goal.values()))
        self.times.push_s = time.perf_counter() - t0

    @abstractmethod
    async def _send(
        self, named: Iterator[tuple[str, torch.Tensor]], version: int, targets: dict[str, str]
    ) -> None: ...

    def forget(self, url: str) -> None:
        """The server at ``url`` was restarted: drop what this sync set up on it."""
        logger.debug("%s forgets %s (nothing set up there)", type(self).__name__, url)

    async def close(self) -> None:
        """Remove the temporary files this sync made."""
        if self._temp_root is not None:
            shutil.rmtree(self._temp_root, ignore_errors=True)
            self._temp_root = None

    def _recording(self, named: Named) -> Iterator[tuple[str, torch.Tensor]]:
        items = named.items() if isinstance(named, Mapping) else named
        for name, tensor in items:
            t = tensor if self._dtype is None else tensor.to(self._dtype)
            self._sums.add(name, t)
            self._vllm.add(name, t)
            yield name, t

    def _freeze(self, backends: set[str]) -> None:
        """Hash what ``backends`` will be compared by; drop the other kind's tensors unhashed
        (vLLM's fused SHA-256 digests cost ~2 s for a 0.5B model, for nothing, before)."""
        if "vllm" in backends:
            self._vllm.freeze()
        else:
            self._vllm = VLLMDigests(self._dtype)
        if backends - {"vllm"}:
            self._sums.freeze()
        else:
            self._sums = NamedDigests(self.cfg.checksum)

    def root(self, prefix: str) -> Path:
        """``Config.root`` (created), else one temp dir (tmpfs if any) for this sync's life."""
        if self.cfg.root:
            Path(self.cfg.root).mkdir(parents=True, exist_ok=True)
            return Path(self.cfg.root).resolve()
        if self._temp_root is None:
            shm = Path("/dev/shm")
            tmp = tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None)
            self._temp_root = Path(tmp).resolve()
        return self._temp_root

    async def verify(self, *, targets: Targets | None = None) -> bool:
        """True when every target holds the last pushed weights and version."""
        if self.version is None:
            raise ConfigError("verify() before push(): nothing to compare with.")
        t0, http, goal = time.perf_counter(), self.client.http, self.targets(targets)
        self.times.hash_s = 0.0
        self._ahead = None
        if self.hash_ahead and "sglang" in goal.values():
            # Embedded servers report every tensor: hash ours while they hash theirs.
            self._ahead = asyncio.ensure_future(self._hash(self._sums, self._sums.names()))
        try:
            return await self._verify(http, goal, t0)
        finally:
            if self._ahead is not None and not self._ahead.done():
                await asyncio.wait([self._ahead])  # never leave the hashing thread behind

    async def _verify(self, http: httpx2.AsyncClient, goal: dict[str, str], t0: float) -> bool:
        async def one(url: str, backend: str) -> ServerReport:
            if backend == "vllm":
                served = await vllm_weight_digests(http, url)
                version = await VLLMDialect().weight_version(http, url)
                return await self._compare(served, self._vllm, version)
            return await self._verify_sglang(http, url)

        reports = await asyncio.gather(*(one(u, b) for u, b in goal.items()))
        self.last_report = dict(zip(goal, reports, strict=True))
        for url, r in self.last_report.items():  # one line per sync: details only when asked
            (logger.debug if r.ok else logger.warning)("weight check %s: %s", url, r)
        self.times.verify_s = time.perf_counter() - t0
        return all(r.ok for r in reports)

    async def _verify_sglang(self, http: httpx2.AsyncClient, url: str) -> ServerReport:
        kind = self._sums.kind
        resp = await http.get(url + "/weights_checksum", params={"per_tensor": 1, "kind": kind})
        if resp.status_code == 404:  # a real SGLang server: compare sampled values
            return await self._verify_by_name(http, url)
        if resp.status_code != 200:
            raise InferenceError(f"{url}/weights_checksum -> {resp.status_code}: {resp.text[:300]}")
        body = resp.json()
        if body.get("kind", "sha256") != kind:
            raise InferenceError(
                f"{url}/weights_checksum answered kind {body.get('kind', 'sha256')!r} checksums "
                f"to a request for {kind!r} (an older server); restart it with this version of "
                "agentrl or set WeightSync.Config.checksum='sha256'."
            )
        if self._ahead is not None:
            await asyncio.shield(self._ahead)
        return await self._compare(body["tensors"], self._sums, _version(body))

    async def _verify_by_name(self, http: httpx2.AsyncClient, url: str) -> ServerReport:
        raise InferenceError(
            f"{url} has no /weights_checksum; use SGLangWeightSync, which keeps value samples "
            "and compares them through SGLang's /get_weights_by_name."
        )

    async def _compare(
        self, served: Mapping[str, str], expected: Digests, version: int
    ) -> ServerReport:
        """Hash (in threads) what the server shows, then ``report``."""
        names = [n for n, d in served.items() if d != EMPTY_DIGEST and n in expected]
        await self._hash(expected, names)
        return report(served, expected, version, self.version)

    async def _hash(self, expected: Digests, names: list[str]) -> None:
        t0 = time.perf_counter()
        sha = not isinstance(expected, NamedDigests) or expected.kind == "sha256"
        threads = self.cfg.hash_threads if sha else 1  # torch sums on all its threads
        await asyncio.to_thread(_hash_all, expected, names, threads)
        self.times.hash_s += time.perf_counter() - t0


def _hash_all(expected: Digests, names: list[str], threads: int) -> None:
    if threads <= 1 or len(names) <= 1:
        for n in names:
            expected.get(n)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(expected.get, names))


def _version(body: Mapping[str, object]) -> int:
    v = body.get("weight_version", 0)
    return v if isinstance(v, int) else int(str(v)) if str(v).isdigit() else 0


def report(
    served: Mapping[str, str], expected: Digests, version: int, want: int | None
) -> ServerReport:
    """Compare a server's digests with the trainer's. A served tensor the trainer did not send
    passes only as a tied alias (the same bytes as a tensor that matched); an empty served
    digest is a tensor the server cannot show (``unverifiable``)."""
    matched, bad, blind = 0, [], 0
    seen: set[str] = set()
    extra: list[tuple[str, str]] = []
    for name, digest in served.items():
        if name not in expected:
            extra.append((name, digest))
        elif digest == EMPTY_DIGEST:
            blind += 1
        elif digest == expected.get(name):
            matched += 1
            seen.add(digest)
        else:
            bad.append(name)
    for name, digest in extra:
        if digest in seen:
            matched += 1
        else:
            bad.append(name)  # the server has a tensor the trainer never sent
    ok = matched > 0 and not bad and version == want
    return ServerReport(matched=matched, mismatched=bad, unverifiable=blind, version=version, ok=ok)


def buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of about ``bucket_bytes`` (at least one tensor each)."""
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


def unique(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Skip a tensor that shares storage with one already yielded (a tied alias)."""
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    for name, t in named:
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        yield name, t
