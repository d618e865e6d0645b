"""WorkerGroup: one Ray actor per rank running a user Worker, called like an ordinary object.

    class ActorWorker(Worker):
        def __init__(self, model_path: str) -> None:
            self.init_process_group()                  # gloo on CPU, nccl on GPU
            self.engine = build_engine(model_path)

        @dispatch(Dispatch.DP_SPLIT)                   # split the batch, concat the results
        def compute_logprobs(self, batch: TrainBatch) -> TrainBatch: ...

        @dispatch(Dispatch.RANK0)                      # run on all ranks, keep rank 0's answer
        def save(self, path: str) -> str: ...

    init_ray_local()
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2))
    actor = WorkerGroup(pool, ActorWorker, kwargs={"model_path": path})
    logprobs = actor.compute_logprobs(batch)                      # dynamic, checked at run time
    logprobs = actor.call(ActorWorker.compute_logprobs, batch)    # statically typed
    future = actor.submit(ActorWorker.compute_logprobs, batch)    # returns at once
    shards = actor.shard(batch)                                   # put once, read by many calls
    logprobs = actor.call_sharded(ActorWorker.compute_logprobs, shards)
    actor.shutdown()

Control and data travel apart: the driver splits a DP_SPLIT batch, ``ray.put``s each shard and
sends rank ``i`` only the ref of shard ``i``; Ray resolves it inside the worker, which reads the
shard from the object store. Broadcast arguments are put once for all ranks. Results stay in the
object store as one ref per rank until the driver asks: ``future.result()`` gathers them, and
``future.sharded()`` hands them, still as refs, to the next group's DP_SPLIT call.
``wg.shard(value)`` puts a value's shards once for several DP_SPLIT calls
(``call_sharded``), and ``agentrl.distributed.traffic`` counts the bytes the driver puts and
gathers (``driver/bytes_out``, ``driver/bytes_in``).

Why ``__getattr__`` plus ``call``, and no generated methods: a method set on the group at run
time (verl's ``setattr``) is invisible to readers and tools. Here ``wg.name`` is resolved on
each access against the methods the Worker class declares with ``@dispatch`` (anything else is
an AttributeError with a suggestion), so there is nothing to generate and nothing to drift. A
type checker cannot follow ``__getattr__``, so ``wg.call(ActorWorker.method, ...)`` and
``wg.submit(...)`` take the method itself: go-to-definition lands on the Worker code, and the
arguments and the gathered return type (``list[R]`` for ONE_TO_ALL, ``R`` for DP_SPLIT) are
checked statically.

Every wait is bounded (``Config.call_timeout_s``); a dead rank is a ``WorkerDiedError`` naming
the rank, the Worker class and the method.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray import ObjectRef
from ray.actor import ActorHandle

from agentrl.distributed.dispatch import (
    Dispatch,
    DispatchedMethod,
    DispatchSpec,
    concat_results,
    dispatched_methods,
    is_splittable,
    split_sequence,
    split_value,
)
from agentrl.distributed.futures import CallSite, GroupFuture, Sharded, wait_all
from agentrl.distributed.ray_utils import worker_runtime_env
from agentrl.distributed.resources import ResourcePool
from agentrl.distributed.traffic import TRAFFIC
from agentrl.distributed.worker import (
    CONTROL_GROUP,
    DataLayout,
    HostInfo,
    Worker,
    WorkerContext,
    WorkerHost,
)
from agentrl.errors import ConfigError, ResourceUnavailableError, WorkerTimeoutError

logger = logging.getLogger(__name__)

W = TypeVar("W", bound=Worker)
P = ParamSpec("P")
G = TypeVar("G")
T = TypeVar("T")

_SCALARS = (type(None), bool, int, float, str)


@functools.cache
def _remote_host() -> Any:
    # concurrency_groups is a valid actor option that Ray's type stubs do not list
    options: dict[str, Any] = {"concurrency_groups": {CONTROL_GROUP: 1}, "max_restarts": 0}
    return ray.remote(**options)(WorkerHost)


class WorkerGroup(Generic[W]):
    """``pool.world_size`` ranks of ``worker_cls``, one Ray actor each, placed on ``pool``."""

    @dataclass(frozen=True, kw_only=True)
    class Config:
        call_timeout_s: float = 600.0
        """Longest wait for any group call before WorkerTimeoutError."""
        start_timeout_s: float = 300.0
        """Longest wait for the actors to be scheduled and the Workers built."""
        health_timeout_s: float = 10.0
        """Longest wait for a health ping."""

    def __init__(
        self,
        pool: ResourcePool,
        worker_cls: type[W],
        *,
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
        share: float = 1.0,
        name: str = "",
        config: Config | None = None,
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise ConfigError(
                f"WorkerGroup needs a subclass of agentrl.distributed.Worker, got {worker_cls!r}."
            )
        self.pool = pool
        self.worker_cls = worker_cls
        self.config = config or WorkerGroup.Config()
        self.name = name or f"{worker_cls.__name__}-{uuid.uuid4().hex[:4]}"
        self.share = share
        self._methods = dispatched_methods(worker_cls)
        self._handles: list[ActorHandle] = []
        self.infos: list[HostInfo] = []
        self.contexts: list[WorkerContext] = []
        self.layouts: list[DataLayout] = []
        pool.reserve(self.name, share)
        try:
            self._start(tuple(args), dict(kwargs or {}))
        except BaseException:
            self._kill_actors()
            pool.release(self.name, remove_if_last=False)  # the pool stays usable for a retry
            raise

    # ------------------------------------------------------------------------------ start-up

    def _start(self, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        host = _remote_host()
        env = worker_runtime_env()
        with_env = {"runtime_env": env} if env else {}
        for rank in range(self.world_size):
            options = self.pool.actor_options(rank, self.share)
            handle = host.options(**options, **with_env).remote(rank)
            self._handles.append(handle)
        site = self._site("describe", self.config.start_timeout_s)
        describe = [h.describe.remote(rank == 0) for rank, h in enumerate(self._handles)]
        try:
            self.infos = wait_all(describe, site)  # type: ignore[assignment]
        except WorkerTimeoutError as e:
            raise ResourceUnavailableError(
                f"{self.name}: not every rank was scheduled within {self.config.start_timeout_s:g}s "
                f"on pool {self.pool!r} (each rank asks for share={self.share:g} of a bundle). "
                f"Check that the groups on this pool fit, and that the pool is not shut down."
            ) from e
        self.contexts = self._contexts(self.infos)
        payload = ray.put((self.worker_cls, args, kwargs))
        starts = [
            h.start.remote(c, payload) for h, c in zip(self._handles, self.contexts, strict=True)
        ]
        layouts = wait_all(starts, self._site("__init__", self.config.start_timeout_s))
        self.layouts = _check_layouts(layouts, self.name)  # type: ignore[arg-type]
        logger.info(
            "started %s: %d rank(s) on %s, rendezvous %s:%d (%s)",
            self.name,
            self.world_size,
            self.pool.name,
            self.contexts[0].master_addr,
            self.contexts[0].master_port,
            self.contexts[0].backend,
        )

    def _contexts(self, infos: list[HostInfo]) -> list[WorkerContext]:
        nodes = [i.node_id for i in infos]
        one_node = len(set(nodes)) == 1
        port = infos[0].port
        if port is None:
            raise RuntimeError("rank 0 did not pick a rendezvous port")
        backend = "nccl" if all(i.gpu_ids for i in infos) else "gloo"
        contexts = []
        for rank, info in enumerate(infos):
            same_node = [r for r, n in enumerate(nodes) if n == info.node_id]
            contexts.append(
                WorkerContext(
                    rank=rank,
                    world_size=len(infos),
                    local_rank=same_node.index(rank),
                    local_world_size=len(same_node),
                    master_addr="127.0.0.1" if one_node else infos[0].node_ip,
                    master_port=port,
                    backend=backend,
                    group_name=self.name,
                    gpu_ids=info.gpu_ids,
                )
            )
        return contexts

    # --------------------------------------------------------------------------------- calls

    def call(
        self, method: DispatchedMethod[W, P, Any, G], /, *args: P.args, **kwargs: P.kwargs
    ) -> G:
        """Run ``method`` on every rank as its ``@dispatch`` mode says, and gather the result."""
        return self.submit(method, *args, **kwargs).result()

    def submit(
        self, method: DispatchedMethod[W, P, Any, G], /, *args: P.args, **kwargs: P.kwargs
    ) -> GroupFuture[G]:
        """Like ``call``, but return at once with a future (one object ref per rank)."""
        if not isinstance(method, DispatchedMethod):
            raise ConfigError(
                f"{self.name}: submit() takes a @dispatch method such as "
                f"{self.worker_cls.__name__}.<method>, got {method!r}."
            )
        spec = self._methods.get(method.spec.name)
        if spec is None:
            raise ConfigError(
                f"{method!r} is not a method of {self.worker_cls.__name__} (group {self.name})."
            )
        return self._submit(spec, args, kwargs)  # type: ignore[return-value]

    def shard(self, value: T) -> Sharded[T]:
        """Split ``value`` for this group's data-parallel ranks and ``ray.put`` each shard once.

        Several DP_SPLIT calls (on this group, or on any group of the same ``dp_size``) can then
        read the same shards through ``call_sharded`` / ``submit_sharded``: the driver ships
        the value once instead of once per call.
        """
        return Sharded.put(value, self.dp_size)

    def call_sharded(
        self,
        method: DispatchedMethod[W, Concatenate[T, P], Any, G],
        data: Sharded[T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> G:
        """``call`` with the method's first argument given as shards already in the object
        store (``shard`` or ``future.sharded()``); statically checked like ``call``."""
        return self.submit_sharded(method, data, *args, **kwargs).result()

    def submit_sharded(
        self,
        method: DispatchedMethod[W, Concatenate[T, P], Any, G],
        data: Sharded[T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> GroupFuture[G]:
        """Like ``call_sharded``, but return at once with a future."""
        if not isinstance(data, Sharded):
            raise ConfigError(
                f"{self.name}: submit_sharded() takes a Sharded value (WorkerGroup.shard or "
                f"future.sharded()), got {type(data).__name__}; use submit() for a plain value."
            )
        if isinstance(method, DispatchedMethod) and method.spec.mode is not Dispatch.DP_SPLIT:
            raise ConfigError(
                f"{method!r} is {method.spec.mode.name}; only DP_SPLIT methods take shards."
            )
        return self.submit(method, data, *args, **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> GroupMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        spec = self.__dict__.get("_methods", {}).get(name)
        if spec is None:
            raise AttributeError(self._explain_missing(name))
        return GroupMethod(self, spec)

    def _submit(
        self, spec: DispatchSpec, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> GroupFuture[object]:
        site = self._site(spec.name, self.config.call_timeout_s)
        routed = _route(spec.mode, args, kwargs, self.layouts, site.where(), spec.name)
        refs: list[ObjectRef] = []
        for rank, (handle, (a, k)) in enumerate(zip(self._live_handles(), routed, strict=True)):
            keep = spec.mode is not Dispatch.RANK0 or rank == 0
            if spec.mode is Dispatch.DP_SPLIT:
                keep = self.layouts[rank].collect
            refs.append(handle.execute.remote(spec.name, keep, *a, **k))
        shard_ranks = _shard_ranks(self.layouts)
        gather = _gatherer(spec.mode, site.where(), shard_ranks)
        return GroupFuture(refs, site, gather, spec.mode, shard_ranks=shard_ranks)

    # ------------------------------------------------------------------------ health and end

    def health(self, timeout_s: float | None = None) -> list[HostInfo]:
        """Ping every rank (answered even while a method runs); raise if one is dead or silent."""
        site = self._site("ping", timeout_s or self.config.health_timeout_s)
        wait_all([h.ping.remote() for h in self._live_handles()], site)
        return list(self.infos)

    def shutdown(self) -> None:
        """Kill the actors and give the pool share back (the last group removes the pool)."""
        self._kill_actors()
        self.pool.release(self.name)

    def _kill_actors(self) -> None:
        for handle in self._handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead, or Ray is shutting down
                logger.debug("kill failed for an actor of %s", self.name, exc_info=True)
        if self._handles:
            logger.info("shut down %s", self.name)
        self._handles = []

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -------------------------------------------------------------------------------- helpers

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    @property
    def dp_size(self) -> int:
        """How many shards a DP_SPLIT call cuts its data into (ranks of one model-parallel
        group share a shard)."""
        return self.layouts[0].dp_size if self.layouts else self.world_size

    @property
    def handles(self) -> list[ActorHandle]:
        """The Ray actor handle of each rank (for advanced use; prefer group calls)."""
        return list(self._handles)

    def methods(self) -> dict[str, Dispatch]:
        """The group-callable methods of the Worker class and their dispatch modes."""
        return {name: spec.mode for name, spec in sorted(self._methods.items())}

    def _live_handles(self) -> list[ActorHandle]:
        if not self._handles:
            raise ConfigError(f"{self.name} was shut down; build a new WorkerGroup.")
        return self._handles

    def _site(self, method: str, timeout_s: float) -> CallSite:
        return CallSite(self.name, self.worker_cls.__name__, method, timeout_s)

    def _explain_missing(self, name: str) -> str:
        cls = self.worker_cls.__name__
        if callable(getattr(self.worker_cls, name, None)):
            return (
                f"{cls}.{name} is not declared for group calls; decorate it with "
                f"@dispatch(Dispatch.ONE_TO_ALL) (or DP_SPLIT, RANK0, ALL_TO_ALL)."
            )
        close = difflib.get_close_matches(name, list(self._methods), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(sorted(self._methods)) or "none"
        return f"{cls} has no group method {name!r}.{hint} Group methods: {known}."

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, {self.worker_cls.__name__} x {self.world_size})"


class ShardCache(Generic[T]):
    """One value's shards in the object store, put once per data-parallel size and read by
    every group of that size: ``cache.on(actor)``, ``cache.on(ref)`` ship the value once when
    both groups cut it into as many shards."""

    def __init__(self, value: T) -> None:
        self.value = value
        self._by_size: dict[int, Sharded[T]] = {}

    def on(self, group: WorkerGroup[Any]) -> Sharded[T]:
        """The shards for ``group`` (``group.shard(value)`` the first time for its size)."""
        if group.dp_size not in self._by_size:
            self._by_size[group.dp_size] = group.shard(self.value)
        return self._by_size[group.dp_size]


class GroupMethod:
    """``wg.<method>``: call it to run and gather, or ``.submit(...)`` for a future."""

    def __init__(self, group: WorkerGroup[Any], spec: DispatchSpec) -> None:
        self._group = group
        self.spec = spec
        fn = getattr(group.worker_cls, spec.name).fn
        self.__name__ = spec.name
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        params = list(inspect.signature(fn).parameters.values())[1:]  # drop self
        self.__signature__ = inspect.Signature(params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.submit(*args, **kwargs).result()

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture[Any]:
        return self._group._submit(self.spec, args, kwargs)

    def __repr__(self) -> str:
        return f"<{self.spec.mode.name} group method {self._group.name}.{self.spec.name}>"


# ---------------------------------------------------------------------------- routing inputs


def _check_layouts(layouts: list[DataLayout], name: str) -> list[DataLayout]:
    """Every shard 0..dp_size-1 is owned by some rank and collected from exactly one."""
    sizes = {lay.dp_size for lay in layouts}
    if len(sizes) != 1:
        raise ConfigError(f"{name}: ranks disagree on the data-parallel size: {sorted(sizes)}")
    dp_size = sizes.pop()
    collected = sorted(lay.dp_rank for lay in layouts if lay.collect)
    if collected != list(range(dp_size)) or any(not 0 <= lay.dp_rank < dp_size for lay in layouts):
        raise ConfigError(
            f"{name}: data_parallel_layout() must give each shard 0..{dp_size - 1} exactly one "
            f"collecting rank; got {[(lay.dp_rank, lay.collect) for lay in layouts]}"
        )
    return layouts


def _shard_ranks(layouts: list[DataLayout]) -> list[int]:
    """The ranks whose DP_SPLIT results are the shards, in shard order."""
    owners = {lay.dp_rank: rank for rank, lay in enumerate(layouts) if lay.collect}
    return [owners[i] for i in range(len(owners))]


def _route(
    mode: Dispatch,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    layouts: list[DataLayout],
    where: str,
    method: str = "",
) -> list[tuple[list[object], dict[str, object]]]:
    """One (args, kwargs) per rank; shards and broadcast values go as object refs.

    A DP_SPLIT argument is cut into ``dp_size`` shards; rank r gets shard ``dp_rank`` (ranks of
    one model-parallel group get the same shard). What is put counts as the driver's
    ``bytes_out`` (``agentrl.distributed.traffic``) under ``method``.
    """
    n = len(layouts)
    dp_size = layouts[0].dp_size if layouts else n
    owner = [lay.dp_rank for lay in layouts]
    names = [f"arg {i}" for i in range(len(args))] + [f"{k}=" for k in kwargs]
    values = [*args, *kwargs.values()]
    columns: list[list[object]] = []  # per argument: the value for each rank
    for label, value in zip(names, values, strict=True):
        at = f"{where}, {label}"
        if mode is Dispatch.ALL_TO_ALL:
            columns.append(split_sequence(value, n, at))
        elif mode is Dispatch.DP_SPLIT and isinstance(value, Sharded):
            if len(value) != dp_size:
                raise ConfigError(
                    f"{at}: got {len(value)} shards for {dp_size} "
                    f"{'ranks' if dp_size == n else 'data-parallel groups'}; call .gather() and "
                    f"pass the whole value so it is split again."
                )
            columns.append([value.refs[owner[r]] for r in range(n)])
        elif mode is Dispatch.DP_SPLIT and is_splittable(value):
            parts = split_value(value, dp_size, at)
            TRAFFIC.sent(method, parts)
            shards = [ray.put(part) for part in parts]
            columns.append([shards[owner[r]] for r in range(n)])
        else:
            columns.append([_broadcast(value, method)] * n)
    if mode is Dispatch.DP_SPLIT and not any(
        isinstance(v, Sharded) or is_splittable(v) for v in values
    ):
        raise ConfigError(
            f"{where} is DP_SPLIT but got nothing to split: pass a list, a Sharded value or an "
            f"object with split(n)/concat (e.g. TrainBatch), or declare it ONE_TO_ALL."
        )
    routed = []
    for rank in range(n):
        row = [col[rank] for col in columns]
        routed.append((row[: len(args)], dict(zip(kwargs, row[len(args) :], strict=True))))
    return routed


def _broadcast(value: object, method: str = "") -> object:
    """Scalars travel inline; anything else is put in the object store once for all ranks."""
    if isinstance(value, (*_SCALARS, ObjectRef)):
        return value
    TRAFFIC.sent(method, value)
    return ray.put(value)


def _gatherer(mode: Dispatch, where: str, shard_ranks: list[int]) -> Any:
    if mode is Dispatch.RANK0:
        return lambda results: results[0]
    if mode is Dispatch.DP_SPLIT:
        return lambda results: concat_results([results[r] for r in shard_ranks], where)
    return list
