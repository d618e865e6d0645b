"""The rollout side of a run: inference servers on loopback, seeded collection, weight sync.

    Fleet.start(model dir) -> N servers (inference.backend) -> SupervisedClient
        embedded: ServerProcess (python -m agentrl.inference.server)
        vllm:     VLLMServer (inference.python has vllm)   sglang: SGLangServer
    Fleet.collect(samples) -> SeededCollector -> RolloutCollector.stream -> groups (sample order)
    Fleet.sync(named tensors, version), by inference.weight_sync, to the routable servers:
        tensors: HTTPTensorWeightSync (/update_weights_from_tensor) | disk | ipc (memfd)
        | vllm (weight_sync/)
        -> push -> verify (checksums where served); the tensors and version are kept
    ServerSupervisor (agentrl/inference/supervisor.py), on the Fleet's event loop:
        dead server -> out of routing -> restarted on its port -> _rejoin: the kept tensors are
        pushed to it and verified (or, before any sync, its checksums equal a peer's) -> routed
        to again; ``metrics()``: inference/server_restarts ...

Reproducible sampling: every generate request of a rollout carries ``SamplingParams.seed``
derived from (run seed, sample uid, group member, turn). The server draws each request from
its own seeded generator, so a request's tokens do not depend on what else is batched with
it, and a resumed run samples exactly what the uninterrupted run sampled. Members are numbered
in the order the collector starts them (tasks start in creation order), and a ``ContextVar``
carries (uid, member) from the collector's task to the generate calls inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol, TypeVar

import httpx2
import torch

from agentrl.chat import ChatTemplate
from agentrl.errors import InferenceError
from agentrl.inference.backends.base import call
from agentrl.inference.backends.vllm import vllm_weight_digests
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, Generator, SamplingParams
from agentrl.inference.supervisor import ServerSupervisor, SupervisedClient
from agentrl.inference.weight_sync import (
    DiskWeightSync,
    HTTPTensorWeightSync,
    IPCWeightSync,
    SGLangWeightSync,
    VLLMWeightSync,
    WeightSync,
    WeightSyncConfig,
)
from agentrl.metrics_schema import ENGINE_COUNTERS
from agentrl.reward import Rubric
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.types import Sample, Trajectory, TrajectoryGroup
from trainers.config import InferenceConfig, RunConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")
Hook = Callable[[], Awaitable[None]]

_ROLLOUT_KEY: ContextVar[tuple[str, int] | None] = ContextVar("agentrl_rollout_key", default=None)


def request_seed(run_seed: int, uid: str, member: int, turn: int) -> int:
    """A 63-bit seed for one generate request, stable across processes and runs."""
    digest = hashlib.blake2b(f"{run_seed}|{uid}|{member}|{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class SeededGenerator:
    """A Generator that stamps each request of a rollout with its (uid, member, turn) seed."""

    def __init__(self, inner: Generator, run_seed: int) -> None:
        self.inner = inner
        self.run_seed = run_seed
        self._turns: dict[tuple[str, int], int] = {}

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion:
        key = _ROLLOUT_KEY.get()
        if key is not None and sampling.seed is None:
            turn = self._turns.get(key, 0)
            self._turns[key] = turn + 1
            sampling = dataclasses.replace(sampling, seed=request_seed(self.run_seed, *key, turn))
        if images:
            return await self.inner.generate(
                input_ids, sampling, session_id=session_id, images=images
            )
        return await self.inner.generate(input_ids, sampling, session_id=session_id)

    def reset(self) -> None:
        self._turns.clear()

    def forget(self, uids: Sequence[str]) -> None:
        """Drop the turn counters of these samples' rollouts (others may still be in flight)."""
        done = set(uids)
        for key in [k for k in self._turns if k[0] in done]:
            del self._turns[key]


class OrderedCollector(Protocol):
    """What ``Fleet.collect`` runs: ``SeededCollector`` or ``RolloutWorkerPool``."""

    def collect_ordered(self, samples: Sequence[Sample]) -> Awaitable[list[TrajectoryGroup]]: ...


class SeededCollector(RolloutCollector):
    """A RolloutCollector whose rollouts are numbered within their group (for request seeds)."""

    def __init__(
        self,
        config: CollectorConfig,
        generator: SeededGenerator,
        template: ChatTemplate,
        *,
        rubric: Rubric | None = None,
    ) -> None:
        super().__init__(config, generator, template, rubric=rubric)
        self._members: dict[str, int] = {}

    async def run_trajectory(self, sample: Sample) -> Trajectory:
        member = self._members.get(sample.uid, 0)  # runs before the first await: creation order
        self._members[sample.uid] = member + 1
        _ROLLOUT_KEY.set((sample.uid, member))  # this task's own context
        return await super().run_trajectory(sample)

    async def collect_ordered(
        self,
        samples: Sequence[Sample],
        on_group: Callable[[TrajectoryGroup], None] | None = None,
    ) -> list[TrajectoryGroup]:
        """Groups of ``samples`` in sample order (they stream in completion order; ``on_group``
        sees each as it finishes)."""
        order = {s.uid: i for i, s in enumerate(samples)}
        groups: list[TrajectoryGroup] = []
        async for g in self.stream(samples):
            groups.append(g)
            if on_group is not None:
                on_group(g)
        self.forget([s.uid for s in samples])
        return sorted(groups, key=lambda g: order[g.uid])

    def forget(self, uids: Sequence[str]) -> None:
        """Drop the member counters of these samples' groups (their rollouts have ended)."""
        for uid in uids:
            self._members.pop(uid, None)


class Fleet:
    """The inference servers of one run, their client, and an event loop to drive them.

    Dead servers are restarted and rejoined by a ``ServerSupervisor`` (``supervisor`` config):
    the Fleet keeps the last synced tensors (a reference to the dict the trainer passed, no
    copy) and version, so a restarted server gets exactly what the others serve."""

    def __init__(
        self,
        cfg: InferenceConfig,
        *,
        run_seed: int,
        dtype: str,
        device: str,
        log_dir: Path,
        supervisor: ServerSupervisor.Config | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_seed = run_seed
        self.dtype = dtype
        self.device = resolve_device(device)
        self.log_dir = log_dir
        self.loop = asyncio.new_event_loop()
        self.servers: list[ServerProcess] = []
        self.client: SupervisedClient | None = None
        self.generator: SeededGenerator | None = None
        self.weight_sync: WeightSync | None = None
        self.supervisor: ServerSupervisor | None = None
        self.supervisor_cfg = supervisor or ServerSupervisor.Config()
        self._last: tuple[Mapping[str, torch.Tensor], int] | None = None
        self._sync_lock = asyncio.Lock()  # one push at a time: a sync or a rejoin
        self._watch: asyncio.Task[None] | None = None
        self._rejoin_sync: WeightSync | None = None  # weight_sync distributed: HTTP or disk
        self._engine_seen: dict[str, dict[str, float]] = {}  # url -> engine counters
        self.interrupt_hooks: list[tuple[Hook, Hook]] = []
        """(begin, end) coroutines run around each interrupting sync (``inference.interrupt``),
        for clients in other processes (rollout workers)."""

    @classmethod
    def for_run(cls, cfg: RunConfig, log_dir: Path) -> Fleet:
        """Servers in the policy's dtype, on its device."""
        return cls(
            cfg.inference,
            run_seed=cfg.seed,
            dtype=cfg.engine.dtype,
            device=cfg.engine.device,
            log_dir=log_dir,
            supervisor=cfg.inference.restart,
        )

    def run(self, aw: Awaitable[T]) -> T:
        return self.loop.run_until_complete(aw)

    def start(self, model_path: str | Path) -> None:
        """Start the servers (in parallel) on free loopback ports, connect a client, and start
        watching them."""
        self.spawn(model_path)
        self.connect()

    def spawn(self, model_path: str | Path) -> None:
        """Start the server processes on free loopback ports without waiting for them, so the
        caller can do other work (build its training workers) while they load; ``connect()``
        waits. A server that fails to start is reported by ``connect()``."""
        self.servers = [self._server(i, str(model_path)) for i in range(self.cfg.num_servers)]
        for server in self.servers:
            server.spawn()

    def start_beside(self, model_path: str | Path, build: Callable[[], None]) -> None:
        """``start`` the servers and run ``build`` (the training workers' construction). On CPU
        the two overlap (the servers load while ``build`` runs: ~a third of a small run's
        setup); GPU servers size their KV cache from the memory free when they start, so there
        they are started and ready before ``build`` loads anything beside them."""
        if all(d == "cpu" for d in self.cfg.placement or [self.device]):
            self.spawn(model_path)
            build()
            self.connect()
        else:
            self.start(model_path)
            build()

    def connect(self) -> None:
        """Wait until every spawned server answers (InferenceError with its log otherwise),
        connect a client, and start watching them."""

        async def wait_all() -> None:
            await asyncio.gather(*(asyncio.to_thread(s.wait_ready) for s in self.servers))

        self.run(wait_all())
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "servers.json").write_text(
            json.dumps([{"url": s.url, "pid": s.pid} for s in self.servers])
        )
        backend = self.cfg.backend
        urls = [s.url if backend == "embedded" else f"{backend}+{s.url}" for s in self.servers]
        self.client = SupervisedClient(urls)
        self.generator = SeededGenerator(self.client, self.run_seed)
        self.weight_sync = self._weight_sync(self.client)
        self.supervisor = ServerSupervisor(
            self.servers, self.client, self._rejoin, self.supervisor_cfg
        )
        if self.supervisor_cfg.enabled:
            self._watch = self.loop.create_task(self.supervisor.watch())

    def attach(self, urls: Sequence[str]) -> None:
        """Use servers someone else started (``agentrl eval --server``): no processes, no
        weight sync, no supervision; ``urls`` as the client takes them (``vllm+http://...``
        for vLLM, ``sglang+http://...`` for SGLang, plain for the embedded server)."""
        if not urls:
            raise InferenceError("Fleet.attach() needs at least one server URL")
        self.client = SupervisedClient(list(urls))
        self.generator = SeededGenerator(self.client, self.run_seed)

    def _server(self, i: int, model: str) -> ServerProcess:
        c = self.cfg
        device = c.placement[i % len(c.placement)] if c.placement else self.device
        log_path = str(self.log_dir / f"server{i}.log")
        if c.backend == "embedded":
            return ServerProcess(
                ServerProcess.Config(
                    model=model,
                    dtype=self.dtype,
                    seed=self.run_seed + i,
                    max_batch_size=c.max_batch_size,
                    num_threads=c.num_threads,
                    startup_timeout_s=c.startup_timeout_s,
                    log_path=log_path,
                    extra_args=[
                        *("--device", device, "--engine", c.engine),
                        *("--kv-cache-gb", str(c.kv_cache_gb)),
                        *("--capture-graphs", c.capture_graphs),
                        *(["--compile-pointwise"] if c.compile_pointwise else []),
                        *("--prefill-every", str(c.prefill_every)),
                        *c.extra_args,
                    ],
                )
            )
        gpu = device.partition(":")[2] if device.startswith("cuda") else ""
        python = c.python or sys.executable
        if c.backend == "vllm":
            from agentrl.inference.backends.vllm import VLLMServer

            env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}
            return VLLMServer(
                VLLMServer.Config(
                    model=model,
                    dtype=self.dtype,
                    seed=self.run_seed + i,
                    python=python,
                    max_batch_size=c.max_batch_size,
                    startup_timeout_s=c.startup_timeout_s,
                    log_path=log_path,
                    extra_args=list(c.extra_args),
                    env=env,
                )
            )
        from agentrl.inference.backends.sglang import SGLangServer

        place = ["--base-gpu-id", gpu] if gpu else []
        return SGLangServer(
            SGLangServer.Config(
                model=model,
                dtype=self.dtype,
                seed=self.run_seed + i,
                python=python,
                startup_timeout_s=c.startup_timeout_s,
                log_path=log_path,
                extra_args=[*place, "--max-running-requests", str(c.max_batch_size), *c.extra_args],
            )
        )

    def _weight_sync(self, client: SupervisedClient) -> WeightSync:
        c = self.cfg
        path = c.sync_path()
        base = WeightSyncConfig(
            bucket_bytes=c.bucket_bytes, dtype=self.dtype, root=c.weights_dir or None
        )
        kw = dataclasses.asdict(base)
        if path == "tensors":
            return HTTPTensorWeightSync(client, base)
        if path == "ipc":
            return IPCWeightSync(client, base)
        if path == "vllm":
            return VLLMWeightSync(client, VLLMWeightSync.Config(**kw))
        if path == "distributed":
            # a broadcast group cannot take a restarted server in: it rejoins by another path
            self._rejoin_sync = (
                HTTPTensorWeightSync(client, base)
                if c.backend == "embedded"
                else SGLangWeightSync(client, SGLangWeightSync.Config(mode="disk", **kw))
            )
            backend = "nccl" if self.device.startswith("cuda") else "gloo"
            return SGLangWeightSync(
                client,
                SGLangWeightSync.Config(mode="distributed", backend=backend, master_port=0, **kw),
            )
        if c.backend == "sglang":
            return SGLangWeightSync(client, SGLangWeightSync.Config(mode="disk", **kw))
        return DiskWeightSync(client, base)

    def collector(
        self, config: CollectorConfig, template: ChatTemplate, *, rubric: Rubric | None = None
    ) -> SeededCollector:
        """A collector on this fleet's servers; ``rubric`` (reward.rubric) rescores each group."""
        if self.generator is None:
            raise InferenceError("Fleet.collector() before start()")
        return SeededCollector(config, self.generator, template, rubric=rubric)

    def collect(
        self,
        collector: OrderedCollector,
        samples: Sequence[Sample],
        *,
        guard: Callable[[Awaitable[list[TrajectoryGroup]]], Awaitable[list[TrajectoryGroup]]]
        | None = None,
    ) -> list[TrajectoryGroup]:
        """``samples``' groups in sample order, from ``collector`` (a ``SeededCollector`` on
        this fleet or the rollout workers); ``guard`` wraps the rollouts (the sync drain's
        deadline). The samples' seed counters are dropped however it ends, and only theirs:
        other rollouts may be in flight (async)."""
        rollouts = collector.collect_ordered(samples)
        try:
            return self.run(guard(rollouts) if guard is not None else rollouts)
        finally:
            if self.generator is not None:
                self.generator.forget([s.uid for s in samples])

    def sync(self, named: Mapping[str, torch.Tensor], version: int, *, verify: bool) -> None:
        """Push weights to every routable server, tag them ``version``, check the checksums
        (``verify``) or at least the versions. Servers out of routing get them on rejoin."""
        self.run(self._sync(named, version, verify))

    async def _sync(self, named: Mapping[str, torch.Tensor], version: int, verify: bool) -> None:
        client, sync, supervisor = self._parts()
        async with self._sync_lock:
            self._last = (named, version)
            await supervisor.check()
            async with self._interrupted(version):
                try:
                    await self._push(named, version)
                except InferenceError:
                    if not await supervisor.confirm_failure():
                        raise
                    logger.warning(
                        "a server died during the sync to version %d; pushing again to %s",
                        version,
                        sorted(client.backends),
                    )
                    await self._push(named, version)
            targets = client.backends
            if not targets:
                return
            if verify:
                if not await sync.verify(targets=targets):
                    raise InferenceError(
                        f"after a {self.cfg.sync_path()} sync to version {version} the servers "
                        f"do not hold the trainer's weights: {sync.last_report}; see {self.log_dir}"
                    )
                return
            versions = await client.weight_versions()
            stale = {u: v for u, v in versions.items() if v != version}
            if stale:
                raise InferenceError(
                    f"servers report weight versions {stale} after a sync to {version}"
                )

    @contextlib.asynccontextmanager
    async def _interrupted(self, version: int) -> AsyncIterator[None]:
        """``inference.interrupt: abort``: around the push, the clients (this one and the
        ``interrupt_hooks``, e.g. rollout workers) hold aborted requests, and the servers are
        paused with abort; afterwards they resume and the held requests ask for the rest of
        their tokens (``InferenceClient.begin_interrupt``)."""
        client, _, _ = self._parts()
        if self.cfg.interrupt != "abort" or not client.backends:
            yield
            return
        client.begin_interrupt()
        for begin, _ in self.interrupt_hooks:
            await begin()
        try:
            try:
                await client.pause("abort")
            except InferenceError as e:  # a dead server: the push below deals with it
                logger.warning("pausing the servers before the sync to %d: %s", version, e)
            yield
        finally:
            try:
                await client.resume()
            except InferenceError as e:  # a server died meanwhile: the supervisor restarts it
                logger.warning("resuming the servers after the sync to %d: %s", version, e)
            client.end_interrupt()
            for _, end in self.interrupt_hooks:
                await end()

    async def _push(self, named: Mapping[str, torch.Tensor], version: int) -> None:
        client, sync, _ = self._parts()
        if client.backends:
            await sync.push(named, version, targets=client.backends)
        else:
            logger.warning("no server is routable; version %d goes to each on rejoin", version)

    async def _rejoin(self, url: str) -> None:
        """Bring a restarted server to what the others serve; raise if it does not match."""
        client, sync, _ = self._parts()
        backend = client.all_backends[url]
        async with self._sync_lock:
            sync.forget(url)  # a broadcast group is dropped: the next sync forms a new one
            sync = self._rejoin_sync or sync
            if self._last is None:  # never synced: it loaded the model the others started from
                return await self._same_as_peer(url, backend)
            named, version = self._last
            targets = {url: backend}
            await sync.push(named, version, targets=targets)
            if not await sync.verify(targets=targets):
                raise InferenceError(
                    f"restarted server {url} does not hold version {version} after a re-push: "
                    f"{sync.last_report.get(url)}"
                )
            logger.info(
                "server %s rejoined at version %d (%s)", url, version, sync.last_report.get(url)
            )

    async def _same_as_peer(self, url: str, backend: str) -> None:
        """Version 0 and, where the backend serves checksums, the same ones as a routable peer."""
        client, _, _ = self._parts()
        http = client.http
        peers = [u for u, b in client.backends.items() if b == backend]
        if backend == "vllm":
            sums = [await vllm_weight_digests(http, u) for u in [url, *peers[:1]]]
        else:
            got = [
                await call(http, "GET", u + "/weights_checksum", params={"per_tensor": "0"})
                for u in [url, *peers[:1]]
            ]
            if got[0].get("weight_version", 0) not in (0, "0", "default"):
                raise InferenceError(f"restarted server {url} reports {got[0]['weight_version']}")
            sums = [g["checksum"] for g in got]
        if len(sums) == 2 and sums[0] != sums[1]:
            raise InferenceError(
                f"restarted server {url} serves other weights than {peers[0]} (version 0)"
            )

    def _parts(self) -> tuple[SupervisedClient, WeightSync, ServerSupervisor]:
        if self.client is None or self.weight_sync is None or self.supervisor is None:
            raise InferenceError("Fleet used before start()")
        return self.client, self.weight_sync, self.supervisor

    def metrics(self) -> dict[str, float]:
        """``inference/server_restarts`` and friends (zeros before start);
        ``inference/request_failovers``: requests retried on another server (run total);
        ``inference/resumed_requests``: requests of this process aborted by an interrupting
        sync that went on from their partial tokens (run total; ``inference.interrupt``)."""
        if self.supervisor is None:
            return {}
        return {
            **self.supervisor.metrics(),
            "inference/servers_routable": float(len(self.client.urls) if self.client else 0),
            "inference/request_failovers": float(self.client.failovers if self.client else 0),
            "inference/resumed_requests": float(self.client.resumed_requests if self.client else 0),
        }

    def engine_metrics(self) -> dict[str, float]:
        """Embedded servers: ``ENGINE_COUNTERS`` since the previous call, summed over the
        routable servers (``agentrl.metrics_schema``); {} for vLLM and SGLang, which report no
        such counters. A server that does not answer, or restarted (its counters went back),
        counts from what it reports now; it is never a failed step."""
        if self.client is None or self.cfg.backend != "embedded":
            return {}
        http = self.client.http

        async def one(url: str) -> dict[str, float] | None:
            try:
                resp = await http.get(url + "/get_server_info", timeout=5.0)
                engine = resp.json().get("engine", {}) if resp.status_code == 200 else {}
            except (httpx2.HTTPError, ValueError) as exc:
                logger.debug("engine metrics of %s: %s", url, exc)
                return None
            return {k: float(engine[k]) for k in ENGINE_COUNTERS if k in engine}

        async def every(urls: list[str]) -> list[dict[str, float] | None]:
            return await asyncio.gather(*(one(u) for u in urls))

        urls = list(self.client.urls)
        now = self.run(every(urls))
        out: dict[str, float] = {}
        for url, counters in zip(urls, now, strict=True):
            if counters is None:
                continue
            before = self._engine_seen.get(url, {})
            self._engine_seen[url] = counters
            for key, value in counters.items():
                delta = value - before.get(key, 0.0)
                metric = ENGINE_COUNTERS[key]
                out[metric] = out.get(metric, 0.0) + (value if delta < 0 else delta)
        return out

    def wait_for_servers(self, timeout_s: float = 600.0) -> None:
        """Block until no restart is under way (or ``timeout_s``)."""
        if self.supervisor is not None:
            self.run(self.supervisor.wait_idle(timeout_s))

    def close(self) -> None:
        async def unwatch() -> None:
            if self._watch is not None:
                self._watch.cancel()
                await asyncio.gather(self._watch, return_exceptions=True)
            if self.supervisor is not None:
                await self.supervisor.close()

        async def disconnect() -> None:
            if self.weight_sync is not None:
                await self.weight_sync.close()
            if self._rejoin_sync is not None:
                await self._rejoin_sync.close()
            if self.client is not None:
                await self.client.aclose()

        self.run(unwatch())
        for s in self.servers:
            s.stop()
        self.run(disconnect())
        self.client = self.supervisor = self.weight_sync = None
        self.servers = []
        self.loop.close()
