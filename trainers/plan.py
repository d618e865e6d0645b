"""Where a run's processes go on one GPU host: the placement plan ``agentrl train --plan`` prints.

    make_plan(cfg, gpus) -> Plan      checks the layout, raises ConfigError naming the fix
    Plan.render() -> text             what runs where, and how the weights travel
    Plan.ray_gpus                     GPUs Ray may hand the training ranks (0 .. world - 1
                                      when the servers are disaggregated: the driver starts
                                      Ray with exactly that many, so it never hands out a
                                      server's GPU)

Two placements (``recipes/scale_*.yaml``):

- **disaggregated**: the training ranks take GPUs ``0 .. W-1`` (``train.world_size`` = W)
  and each server the GPU ``inference.placement`` names, none of them a training GPU;
- **colocated**: servers share the training GPUs (``inference.placement`` empty or naming
  training GPUs): generation and training take turns on the same memory.

A Megatron policy's ranks are laid out as Megatron-core orders them by default
(tensor-parallel fastest, then context, data, pipeline):
``rank = tp + TP * (cp + CP * (dp + DP * pp))``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError
from agentrl.gpu_env import MULTICAST_OFF


@dataclass(frozen=True)
class RankSlot:
    rank: int
    gpu: int | None  # None: CPU
    coords: dict[str, int] = field(default_factory=dict)  # tp, cp, dp, pp (Megatron)


@dataclass(frozen=True)
class Plan:
    gpus: int
    backend: str  # the policy's engine backend
    layout: dict[str, int]  # tp, pp, cp, dp
    ranks: list[RankSlot]
    servers: list[int | None]  # each server's GPU (None: CPU)
    server_backend: str
    weight_sync: str
    sync_transport: str
    rollout_workers: int
    colocated: bool

    @property
    def ray_gpus(self) -> int | None:
        """GPUs to start Ray with: the training ranks' when servers have GPUs of their own."""
        if self.gpus == 0 or self.colocated:
            return None
        return len(self.ranks)

    def render(self) -> str:
        out = []
        kind = "colocated" if self.colocated else "disaggregated"
        used = sorted({g for g in [*(r.gpu for r in self.ranks), *self.servers] if g is not None})
        out.append(f"placement: {kind}, {len(used)} of {self.gpus} GPUs used")
        lay = self.layout
        out.append(
            f"trainer: {self.backend}, {len(self.ranks)} ranks = TP {lay['tp']} x PP {lay['pp']} "
            f"x CP {lay['cp']} x DP {lay['dp']}"
            + (f"; Ray started with {self.ray_gpus} GPUs" if self.ray_gpus else "")
        )
        for r in self.ranks:
            coords = " ".join(f"{k} {v}" for k, v in r.coords.items())
            out.append(f"  rank {r.rank}: {_dev(r.gpu)}  {coords}".rstrip())
        out.append(f"servers: {len(self.servers)} x {self.server_backend}, sticky routing")
        for i, g in enumerate(self.servers):
            out.append(f"  server {i}: {_dev(g)}")
        out.append(
            f"weight sync: {self.weight_sync} ({self.sync_transport}), every step, "
            "verified by checksums"
        )
        where = f"{self.rollout_workers} Ray actors" if self.rollout_workers else "the driver"
        out.append(f"rollouts: on {where}")
        env = " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items())
        out.append(f"every process: {env}")
        return "\n".join(out)


def _dev(gpu: int | None) -> str:
    return "cpu" if gpu is None else f"cuda:{gpu}"


def _gpu_of(device: str) -> int | None:
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    head, _, idx = device.partition(":")
    if head != "cuda" or not idx.isdigit():
        raise ConfigError(f"inference.placement entries are cpu, cuda or cuda:N, got {device!r}")
    return int(idx)


def make_plan(cfg: Any, gpus: int) -> Plan:
    """The plan of ``cfg`` (a ``RunConfig``) on a host with ``gpus`` GPUs (0: CPU only)."""
    from trainers.serving import resolve_device

    world = cfg.train.world_size
    on_gpu = resolve_device(cfg.engine.device) == "cuda" if gpus else False
    if cfg.engine.device.startswith("cuda") and not gpus:
        raise ConfigError(
            "engine.device is cuda but the plan has no GPUs: pass --gpus N (the host's count)"
        )
    mp = cfg.megatron if cfg.engine.backend == "megatron" else None
    tp = mp.tensor_parallel_size if mp else 1
    pp = mp.pipeline_parallel_size if mp else 1
    cp = mp.context_parallel_size if mp else 1
    if world % (tp * pp * cp):
        raise ConfigError(
            f"train.world_size ({world}) is not a multiple of TP x PP x CP ({tp} x {pp} x {cp})"
        )
    dp = world // (tp * pp * cp)
    if on_gpu and world > gpus:
        raise ConfigError(
            f"train.world_size ({world}) ranks need {world} GPUs; the host has {gpus}"
        )
    ranks = []
    for r in range(world):
        t, rest = r % tp, r // tp
        c, rest = rest % cp, rest // cp
        d, p = rest % dp, rest // dp
        coords = {"tp": t, "cp": c, "dp": d, "pp": p} if mp else {"dp": r}
        ranks.append(RankSlot(rank=r, gpu=r if on_gpu else None, coords=coords))
    inf = cfg.inference
    placement = inf.placement or [cfg.engine.device if on_gpu else "cpu"]
    servers: list[int | None] = []
    for i in range(inf.num_servers):
        dev = placement[i % len(placement)]
        if dev == "auto":
            dev = "cuda" if on_gpu else "cpu"
        gpu = _gpu_of(dev)
        if gpu is not None and gpu >= gpus:
            raise ConfigError(
                f"server {i} is placed on cuda:{gpu} but the host has {gpus} GPUs "
                f"(inference.placement={list(inf.placement)})"
            )
        servers.append(gpu)
    train_gpus = {s.gpu for s in ranks if s.gpu is not None}
    shared = [g for g in servers if g is not None and g in train_gpus]
    apart = [g for g in servers if g is not None and g not in train_gpus]
    if shared and apart:
        raise ConfigError(
            f"some servers share training GPUs ({sorted(set(shared))}) and others have their "
            f"own ({sorted(set(apart))}): place all servers on training GPUs (colocated) or "
            "none (disaggregated)"
        )
    path = inf.sync_path()
    transport = {
        "distributed": "NCCL broadcast from the driver" if on_gpu else "gloo broadcast",
        "ipc": "shared memory / CUDA IPC on this host",
        "tensors": "HTTP safetensors buckets",
        "disk": "files",
        "vllm": "vLLM's transfer engine",
    }.get(path, path)
    return Plan(
        gpus=gpus,
        backend=cfg.engine.backend,
        layout={"tp": tp, "pp": pp, "cp": cp, "dp": dp},
        ranks=ranks,
        servers=servers,
        server_backend=inf.backend,
        weight_sync=path,
        sync_transport=transport,
        rollout_workers=cfg.rollout_workers.num,
        colocated=not apart,
    )
