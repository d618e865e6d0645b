"""The Worker base class, and the Ray actor that hosts one Worker per rank.

    WorkerGroup --creates--> WorkerHost actor (one process per rank)
                --describe()--> pid, node, GPUs (+ a free port, on rank 0)
                --start(context, cls, args)--> sets RANK/WORLD_SIZE/MASTER_* env, builds cls(*args)
                --execute(name, *shard refs)--> Ray resolves the refs in the worker, runs the method

A user subclasses ``Worker`` and writes an ordinary ``__init__`` (no ``super().__init__`` call
needed): the rank context is attached before ``__init__`` runs, so ``self.rank`` and
``self.init_process_group()`` work inside it. A Worker can also be built outside Ray, where it
is rank 0 of a world of one (handy in unit tests).

The host is started in two steps so that rank 0 can pick the rendezvous port before any user
code runs: a Worker whose ``__init__`` joins a collective would otherwise block rank 0 before
the other ranks learn the port. Rank 0 picks it by listening on 127.0.0.1 port 0 and keeps
that socket for its rendezvous store, so the store listens on loopback only and no other
process can take the port in between (``rendezvous.py``).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import ray

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CONTROL_GROUP = "control"
"""Ray concurrency group for health pings, so a ping is answered while a method runs."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerContext:
    """Where one rank sits: what torch.distributed needs, and which group it belongs to."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str  # "gloo" on CPU bundles, "nccl" on GPU bundles
    group_name: str
    gpu_ids: tuple[int, ...] = ()

    @classmethod
    def single(cls) -> WorkerContext:
        """Rank 0 of a world of one, for a Worker built outside a WorkerGroup."""
        return cls(
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            group_name="local",
        )

    def env(self) -> dict[str, str]:
        """The environment variables torch.distributed's ``env://`` rendezvous reads."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


_active_context: WorkerContext | None = None


class Worker:
    """Code that runs on every rank of a WorkerGroup; subclass it and decorate methods.

    class ActorWorker(Worker):
        def __init__(self, lr: float) -> None:
            self.init_process_group()          # gloo on CPU, nccl on GPU
            self.lr = lr

        @dispatch(Dispatch.DP_SPLIT)
        def compute_logprobs(self, batch: TrainBatch) -> TrainBatch: ...
    """

    _agentrl_context: WorkerContext

    def __new__(cls, *args: object, **kwargs: object) -> Self:
        self = super().__new__(cls)
        self._agentrl_context = _active_context or WorkerContext.single()
        return self

    @property
    def context(self) -> WorkerContext:
        return self._agentrl_context

    @property
    def rank(self) -> int:
        return self._agentrl_context.rank

    @property
    def world_size(self) -> int:
        return self._agentrl_context.world_size

    @property
    def device(self) -> torch.device:
        """``cuda:0`` when Ray gave this rank a GPU (it sees only its own), else ``cpu``."""
        import torch

        return torch.device("cuda", 0) if self._agentrl_context.gpu_ids else torch.device("cpu")

    def data_parallel_layout(self) -> DataLayout:
        """This rank's data shard; override when ranks form model-parallel groups.

        Asked once, after ``__init__``: a DP_SPLIT call cuts its inputs into ``dp_size``
        shards, hands shard ``dp_rank`` to this rank, and gathers the ``collect`` ranks'
        results in shard order.
        """
        return DataLayout(dp_rank=self.rank, dp_size=self.world_size)

    def init_process_group(self, timeout_s: float = 300.0) -> None:
        """Join the group's torch.distributed world; a no-op if already joined.

        Rank 0 serves the rendezvous store on the master address only (see ``rendezvous``).
        """
        import torch.distributed as dist

        from agentrl.distributed.rendezvous import init_process_group_bound

        if dist.is_initialized():
            return
        ctx = self._agentrl_context
        os.environ.update(ctx.env())
        if ctx.backend == "nccl":
            import torch

            torch.cuda.set_device(0)
        init_process_group_bound(
            backend=ctx.backend,
            master_addr=ctx.master_addr,
            master_port=ctx.master_port,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout_s=timeout_s,
        )


@dataclass(frozen=True, slots=True)
class DataLayout:
    """Which data-parallel shard a rank owns, and whether its results are gathered.

    Plain data parallelism: rank r owns shard r of ``world_size`` and every rank is gathered.
    A rank of a model-parallel engine (tensor/pipeline parallel) shares its shard with the
    other ranks of its model-parallel group, and only one of them (``collect``) returns it.
    """

    dp_rank: int
    dp_size: int
    collect: bool = True


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What a host reports about its process before the Worker is built."""

    pid: int
    node_id: str
    node_ip: str
    gpu_ids: tuple[int, ...]
    port: int | None  # rank 0 only: the port it listens on for the rendezvous (on loopback)


class WorkerHost:
    """The Ray actor behind one rank. Made remote by WorkerGroup (with placement options)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.worker: Worker | None = None

    def describe(self, pick_port: bool) -> HostInfo:
        from agentrl.distributed.rendezvous import reserve_port

        ctx = ray.get_runtime_context()
        return HostInfo(
            pid=os.getpid(),
            node_id=ctx.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            gpu_ids=tuple(int(g) for g in ray.get_gpu_ids()),
            port=reserve_port() if pick_port else None,
        )

    def start(
        self, context: WorkerContext, payload: tuple[type[Worker], tuple[Any, ...], dict[str, Any]]
    ) -> DataLayout:
        global _active_context
        worker_cls, args, kwargs = payload
        os.environ.update(context.env())
        _active_context = context
        try:
            self.worker = worker_cls(*args, **kwargs)
        finally:
            _active_context = None
        return self.worker.data_parallel_layout()

    def execute(self, method: str, keep_result: bool, /, *args: Any, **kwargs: Any) -> Any:
        if self.worker is None:
            raise RuntimeError(f"rank {self.rank}: the worker was not started")
        result = getattr(self.worker, method)(*args, **kwargs)
        return result if keep_result else None

    @ray.method(concurrency_group=CONTROL_GROUP)
    def ping(self) -> int:
        return os.getpid()
