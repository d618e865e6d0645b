"""Results of group calls as Ray object refs: GroupFuture (one call) and Sharded (data by rank).

    fut = wg.submit(ActorWorker.compute_logprobs, batch)    # returns at once: one ref per rank
    ...                                                     # the driver does other work
    logprobs = fut.result()                                 # fetch + concat, bounded by a timeout
    sharded = fut.sharded()                                 # or keep the shards in the object store
    wg2.update(sharded)                                     # rank i gets shard i, by reference

Every wait here is bounded. Results are collected as they finish (``ray.wait``), so the first
failing rank is reported at once, even while other ranks are stuck in a collective waiting
for it. Ray errors are turned into agentrl errors that name the rank, the Worker class and
the method: a dead process -> ``WorkerDiedError``, an exception in the method ->
``TrainingError``, no answer in time -> ``WorkerTimeoutError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import ray
from ray import ObjectRef
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from agentrl.distributed.dispatch import Dispatch, concat_results, is_splittable, split_value
from agentrl.distributed.traffic import TRAFFIC
from agentrl.errors import ConfigError, TrainingError, WorkerDiedError, WorkerTimeoutError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CallSite:
    """Which call a set of refs belongs to, for error messages."""

    group: str
    worker_cls: str
    method: str
    timeout_s: float

    def where(self, rank: int | None = None) -> str:
        who = f"rank {rank} of " if rank is not None else ""
        return f"{who}{self.group} ({self.worker_cls}.{self.method})"


def wait_all(
    refs: Sequence[ObjectRef], site: CallSite, timeout_s: float | None = None
) -> list[object]:
    """``ray.get`` every ref (ref i belongs to rank i), failing fast and within the timeout."""
    timeout = site.timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout
    index = {ref: rank for rank, ref in enumerate(refs)}
    results: list[object] = [None] * len(refs)
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0.0))
        if not ready:
            ranks = sorted(index[r] for r in pending)
            raise WorkerTimeoutError(
                f"{site.where()}: no result from rank(s) {ranks} after {timeout:g}s. They may be "
                f"stuck (e.g. a collective waiting for a peer) or just slow: check the worker "
                f"logs, then raise WorkerGroup.Config.call_timeout_s or pass timeout_s=."
            )
        for ref in ready:
            try:
                results[index[ref]] = get_one(ref, site, index[ref])
            except TrainingError:
                _raise_death_first(pending, index, site)
                raise
    return results


def _raise_death_first(
    pending: list[ObjectRef], index: dict[ObjectRef, int], site: CallSite
) -> None:
    """When a rank fails, report a dead rank instead if one is already known: a peer's death is
    the usual cause of a collective failing on the ranks that survived."""
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except RayActorError:
            get_one(ref, site, index[ref])  # raises WorkerDiedError
        except Exception:
            pass


def get_one(ref: ObjectRef, site: CallSite, rank: int, timeout_s: float | None = None) -> object:
    """``ray.get`` one ref of rank ``rank``, translating Ray's errors."""
    try:
        return ray.get(ref, timeout=site.timeout_s if timeout_s is None else timeout_s)
    except RayActorError as e:
        raise WorkerDiedError(
            f"{site.where(rank)} died: {_first_line(e)}. The group cannot go on without it: call "
            f"shutdown() on the WorkerGroup and build a new one (resume from the last "
            f"checkpoint); the worker's log (stderr above, or /tmp/ray/session_latest/logs) "
            f"says why it died."
        ) from e
    except RayTaskError as e:
        cause = e.cause if isinstance(e.cause, BaseException) else e
        raise TrainingError(f"{site.where(rank)} raised {type(cause).__name__}: {cause}") from cause
    except GetTimeoutError as e:
        raise WorkerTimeoutError(
            f"{site.where(rank)}: no result after {site.timeout_s:g}s; raise "
            f"WorkerGroup.Config.call_timeout_s or pass timeout_s=."
        ) from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    reason = next((ln for ln in lines if "because" in ln or "killed" in ln), None)
    return reason or (lines[0] if lines else type(e).__name__)


class GroupFuture(Generic[T]):
    """One in-flight group call: a ref per rank, and how to gather them into a ``T``."""

    def __init__(
        self,
        refs: Sequence[ObjectRef],
        site: CallSite,
        gather: Callable[[list[object]], T],
        mode: Dispatch,
        *,
        shard_ranks: Sequence[int] | None = None,
    ) -> None:
        self.refs = list(refs)
        self.site = site
        self.mode = mode
        self._gather = gather
        self._shard_ranks = (
            list(range(len(self.refs))) if shard_ranks is None else list(shard_ranks)
        )

    def result(self, timeout_s: float | None = None) -> T:
        """Wait (at most ``timeout_s``, default the group's ``call_timeout_s``) and gather."""
        results = wait_all(self.refs, self.site, timeout_s)
        TRAFFIC.received(self.site.method, results)
        return self._gather(results)

    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def sharded(self) -> Sharded[T]:
        """The per-rank results left in the object store, for a DP_SPLIT call's output."""
        if self.mode is not Dispatch.DP_SPLIT:
            raise ConfigError(
                f"{self.site.where()} is a {self.mode.name} method; only DP_SPLIT results are "
                f"shards of one value. Use result() instead."
            )
        return Sharded([self.refs[r] for r in self._shard_ranks], self.site)

    def __repr__(self) -> str:
        return f"<GroupFuture {self.site.where()} ranks={len(self.refs)}>"


class Sharded(Generic[T]):
    """A value cut into one shard per rank, each shard a ref in the Ray object store.

    Passed to a DP_SPLIT method of a group with as many ranks, shard ``i`` goes to rank ``i``
    by reference: the driver never fetches the shards. ``gather()`` fetches and concatenates.
    """

    def __init__(self, refs: Sequence[ObjectRef], site: CallSite | None = None) -> None:
        self.refs = list(refs)
        self.site = site or CallSite("driver", "Sharded", "gather", 600.0)

    @classmethod
    def put(cls, value: T, n: int) -> Sharded[T]:
        """Split ``value`` (a list or a splittable object) in ``n`` parts and ``ray.put`` each."""
        if not is_splittable(value):
            raise TrainingError(
                f"Sharded.put needs a list or an object with split(n) and concat, got "
                f"{type(value).__name__}."
            )
        parts = split_value(value, n, "Sharded.put")
        TRAFFIC.sent("Sharded.put", parts)
        return cls([ray.put(part) for part in parts])

    def gather(self, timeout_s: float | None = None) -> T:
        """Fetch every shard and concatenate them in rank order."""
        parts = wait_all(self.refs, self.site, timeout_s)
        TRAFFIC.received(self.site.method, parts)
        return concat_results(parts, self.site.where())  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.refs)

    def __repr__(self) -> str:
        return f"<Sharded {len(self.refs)} shard(s) from {self.site.where()}>"
