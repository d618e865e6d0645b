"""The rollout side of a run: inference servers on loopback, seeded collection, weight sync.

    Fleet.start(model dir) -> N servers (inference.backend) -> InferenceClient
        embedded: ServerProcess (python -m agentrl.inference.server)
        vllm:     VLLMServer (inference.python has vllm)   sglang: SGLangServer
    Fleet.collect(samples) -> SeededCollector -> RolloutCollector.stream -> groups (sample order)
    Fleet.sync(named tensors, version), by inference.weight_sync:
        tensors: /update_weights_from_tensor (HTTP) -> /weights_checksum check
        disk | vllm: a WeightSync (weight_sync.py) -> push -> verify (checksums where served)

Reproducible sampling: every generate request of a rollout carries ``SamplingParams.seed``
derived from (run seed, sample uid, group member, turn). The server draws each request from
its own seeded generator, so a request's tokens do not depend on what else is batched with
it, and a resumed run samples exactly what the uninterrupted run sampled. Members are numbered
in the order the collector starts them (tasks start in creation order), and a ``ContextVar``
carries (uid, member) from the collector's task to the generate calls inside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import sys
from collections.abc import Awaitable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

import torch

from agentrl.chat import ChatTemplate
from agentrl.errors import InferenceError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, Generator, SamplingParams
from agentrl.inference.weight_sync import (
    DiskWeightSync,
    SGLangWeightSync,
    VLLMWeightSync,
    WeightSync,
    WeightSyncConfig,
)
from agentrl.inference.weights import checksum_named_tensors
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.types import Sample, Trajectory, TrajectoryGroup
from trainers.config import InferenceConfig, RunConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

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
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        key = _ROLLOUT_KEY.get()
        if key is not None and sampling.seed is None:
            turn = self._turns.get(key, 0)
            self._turns[key] = turn + 1
            sampling = dataclasses.replace(sampling, seed=request_seed(self.run_seed, *key, turn))
        return await self.inner.generate(input_ids, sampling, session_id=session_id)

    def reset(self) -> None:
        self._turns.clear()


class SeededCollector(RolloutCollector):
    """A RolloutCollector whose rollouts are numbered within their group (for request seeds)."""

    def __init__(
        self, config: CollectorConfig, generator: SeededGenerator, template: ChatTemplate
    ) -> None:
        super().__init__(config, generator, template)
        self._members: dict[str, int] = {}

    async def run_trajectory(self, sample: Sample) -> Trajectory:
        member = self._members.get(sample.uid, 0)  # runs before the first await: creation order
        self._members[sample.uid] = member + 1
        _ROLLOUT_KEY.set((sample.uid, member))  # this task's own context
        return await super().run_trajectory(sample)

    async def collect_ordered(self, samples: Sequence[Sample]) -> list[TrajectoryGroup]:
        """Groups of ``samples`` in sample order (they stream in completion order)."""
        order = {s.uid: i for i, s in enumerate(samples)}
        groups = [g async for g in self.stream(samples)]
        for s in samples:
            self._members.pop(s.uid, None)
        return sorted(groups, key=lambda g: order[g.uid])


class Fleet:
    """The inference servers of one run, their client, and an event loop to drive them."""

    def __init__(
        self, cfg: InferenceConfig, *, run_seed: int, dtype: str, device: str, log_dir: Path
    ) -> None:
        self.cfg = cfg
        self.run_seed = run_seed
        self.dtype = dtype
        self.device = resolve_device(device)
        self.log_dir = log_dir
        self.loop = asyncio.new_event_loop()
        self.servers: list[ServerProcess] = []
        self.client: InferenceClient | None = None
        self.generator: SeededGenerator | None = None
        self.weight_sync: WeightSync | None = None
        """None: the embedded tensors path (``client.update_weights_from_tensors``)."""

    @classmethod
    def for_run(cls, cfg: RunConfig, log_dir: Path) -> Fleet:
        """Servers in the policy's dtype, on its device."""
        return cls(cfg.inference, run_seed=cfg.seed, dtype=cfg.engine.dtype, device=cfg.engine.device,
                   log_dir=log_dir)  # fmt: skip

    def run(self, aw: Awaitable[T]) -> T:
        return self.loop.run_until_complete(aw)

    def start(self, model_path: str | Path) -> None:
        """Start the servers (in parallel) on free loopback ports and connect a client."""
        self.servers = [self._server(i, str(model_path)) for i in range(self.cfg.num_servers)]

        async def start_all() -> None:
            await asyncio.gather(*(asyncio.to_thread(s.start) for s in self.servers))

        self.run(start_all())
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "servers.json").write_text(
            json.dumps([{"url": s.url, "pid": s.pid} for s in self.servers])
        )
        backend = self.cfg.backend
        urls = [s.url if backend == "embedded" else f"{backend}+{s.url}" for s in self.servers]
        self.client = InferenceClient(urls)
        self.generator = SeededGenerator(self.client, self.run_seed)
        self.weight_sync = self._weight_sync(self.client)

    def _server(self, i: int, model: str) -> ServerProcess:
        c = self.cfg
        device = c.placement[i % len(c.placement)] if c.placement else self.device
        log_path = str(self.log_dir / f"server{i}.log")
        if c.backend == "embedded":
            return ServerProcess(ServerProcess.Config(
                model=model, dtype=self.dtype, seed=self.run_seed + i,
                max_batch_size=c.max_batch_size, num_threads=c.num_threads,
                startup_timeout_s=c.startup_timeout_s, log_path=log_path,
                extra_args=["--device", device],
            ))  # fmt: skip
        gpu = device.partition(":")[2] if device.startswith("cuda") else ""
        python = c.python or sys.executable
        if c.backend == "vllm":
            from agentrl.inference.backends.vllm import VLLMServer

            env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}
            return VLLMServer(VLLMServer.Config(
                model=model, dtype=self.dtype, seed=self.run_seed + i, python=python,
                max_batch_size=c.max_batch_size, startup_timeout_s=c.startup_timeout_s,
                log_path=log_path, extra_args=list(c.extra_args), env=env,
            ))  # fmt: skip
        from agentrl.inference.backends.sglang import SGLangServer

        place = ["--base-gpu-id", gpu] if gpu else []
        return SGLangServer(SGLangServer.Config(
            model=model, dtype=self.dtype, seed=self.run_seed + i, python=python,
            startup_timeout_s=c.startup_timeout_s, log_path=log_path,
            extra_args=[*place, "--max-running-requests", str(c.max_batch_size), *c.extra_args],
        ))  # fmt: skip

    def _weight_sync(self, client: InferenceClient) -> WeightSync | None:
        c = self.cfg
        path = c.sync_path()
        if path == "tensors":
            return None
        base = WeightSyncConfig(bucket_bytes=c.bucket_bytes, dtype=self.dtype,
                                root=c.weights_dir or None)  # fmt: skip
        kw = dataclasses.asdict(base)
        if path == "vllm":
            return VLLMWeightSync(client, VLLMWeightSync.Config(**kw))
        if c.backend == "sglang":
            return SGLangWeightSync(client, SGLangWeightSync.Config(mode="disk", **kw))
        return DiskWeightSync(client, base)

    def collector(self, config: CollectorConfig, template: ChatTemplate) -> SeededCollector:
        if self.generator is None:
            raise InferenceError("Fleet.collector() before start()")
        return SeededCollector(config, self.generator, template)

    def collect(
        self, collector: SeededCollector, samples: Sequence[Sample]
    ) -> list[TrajectoryGroup]:
        groups = self.run(collector.collect_ordered(samples))
        if self.generator is not None:
            self.generator.reset()
        return groups

    def sync(self, named: Mapping[str, torch.Tensor], version: int, *, verify: bool) -> None:
        """Push weights to every server, tag them ``version``, and check the checksums."""
        assert self.client is not None
        if self.weight_sync is not None:
            return self._sync_with(self.weight_sync, named, version, verify=verify)
        versions = self.run(
            self.client.update_weights_from_tensors(
                named, version, bucket_bytes=self.cfg.bucket_bytes
            )
        )
        stale = {u: v for u, v in versions.items() if v != version}
        if stale:
            raise InferenceError(
                f"servers report weight versions {stale} after a sync to {version}"
            )
        if verify:
            self.verify(named)

    def _sync_with(
        self, sync: WeightSync, named: Mapping[str, torch.Tensor], version: int, *, verify: bool
    ) -> None:
        assert self.client is not None
        self.run(sync.push(named.items(), version))
        if verify:
            if not self.run(sync.verify()):
                raise InferenceError(
                    f"after a {self.cfg.sync_path()} sync to version {version} the servers do not "
                    f"hold the trainer's weights: {sync.last_report}; see {self.log_dir}"
                )
            return
        versions = self.run(self.client.weight_versions())
        stale = {u: v for u, v in versions.items() if v != version}
        if stale:
            raise InferenceError(
                f"servers report weight versions {stale} after a sync to {version}"
            )

    def verify(self, named: Mapping[str, torch.Tensor]) -> None:
        """Every tensor the trainer sent must have the same bytes (in the serving dtype) on every server."""
        assert self.client is not None
        local = checksum_named_tensors(named.items(), dtype=getattr(torch, self.dtype))
        for url, remote in self.run(self.client.weights_checksum(per_tensor=True)).items():
            bad = [n for n, c in local.tensors.items() if remote.tensors.get(n) != c]
            if bad:
                raise InferenceError(
                    f"{url} holds different weights than the trainer for {len(bad)} tensor(s), "
                    f"e.g. {bad[:3]}; the weight sync is broken"
                )

    def close(self) -> None:
        if self.client is not None:
            self.run(self.client.aclose())
            self.client = None
        for s in self.servers:
            s.stop()
        self.servers = []
        self.loop.close()
