"""Declare, once per Worker method, how a group call splits its inputs and gathers its outputs.

    class ActorWorker(Worker):
        @dispatch(Dispatch.DP_SPLIT)
        def compute_logprobs(self, batch: TrainBatch) -> TrainBatch: ...

driver args --split_inputs--> one (args, kwargs) per rank --(Ray)--> method on every rank
            <--gather_outputs-- one result per rank

Modes (every mode runs the method on every rank, so collectives inside it work):

- ``ONE_TO_ALL``: every rank gets the same arguments; the driver gets ``list`` of results by rank.
- ``ALL_TO_ALL``: every argument is a sequence with one item per rank; results as a list by rank.
- ``DP_SPLIT``: every splittable argument (a ``list``, or an object with ``split(n)`` and a
  ``concat`` classmethod, such as ``TrainBatch``) is cut into ``world_size`` contiguous shards;
  other arguments are broadcast. Results are concatenated in rank order (``None`` stays ``None``).
- ``RANK0``: like ``ONE_TO_ALL``, but only rank 0's result comes back (the others return nothing).

``split(n)`` means "n parts", not "parts of size n". Lists are cut like ``numpy.array_split``:
shard sizes differ by at most one, earlier ranks take the extra items.

The decorator returns a ``DispatchedMethod`` descriptor, not a wrapper function: on a Worker
instance it is the plain bound method (inside a rank, ``self.compute_logprobs(b)`` is a local
call), and on the class it carries the mode and a static type for ``WorkerGroup.call``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
    runtime_checkable,
)

from agentrl.errors import ConfigError, TrainingError

P = ParamSpec("P")
R = TypeVar("R")
G_co = TypeVar("G_co", covariant=True)  # only ever produced, so a list[dict] fits a Sequence
W_contra = TypeVar("W_contra", contravariant=True)
W = TypeVar("W")


class Dispatch(StrEnum):
    """How a group call maps driver arguments to ranks and rank results back to the driver."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_SPLIT = "dp_split"
    RANK0 = "rank0"


@runtime_checkable
class Splittable(Protocol):
    """A value that can be cut into ``n`` parts and put back together (e.g. ``TrainBatch``)."""

    def split(self, n: int) -> Sequence[Self]: ...

    @classmethod
    def concat(cls, parts: Sequence[Self]) -> Self: ...


@dataclass(frozen=True, slots=True)
class DispatchSpec:
    """What ``@dispatch`` records about one method."""

    name: str
    mode: Dispatch


class DispatchedMethod(Generic[W_contra, P, R, G_co]):
    """A Worker method with a dispatch mode. ``G_co`` is what the driver gets from a group call."""

    def __init__(self, fn: Callable[Concatenate[W_contra, P], R], mode: Dispatch) -> None:
        self.fn = fn
        self.spec = DispatchSpec(name=fn.__name__, mode=mode)
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner: type, name: str) -> None:
        self.spec = DispatchSpec(name=name, mode=self.spec.mode)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: W_contra, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object, owner: type | None = None) -> object:
        if obj is None:
            return self
        return types.MethodType(self.fn, obj)

    def __call__(self, worker: W_contra, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(worker, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.spec.mode.name} method {self.fn.__qualname__}>"


@overload
def dispatch(
    mode: Literal[Dispatch.ONE_TO_ALL],
) -> Callable[[Callable[Concatenate[W, P], R]], DispatchedMethod[W, P, R, list[R]]]: ...


@overload
def dispatch(
    mode: Literal[Dispatch.ALL_TO_ALL],
) -> Callable[[Callable[Concatenate[W, P], R]], DispatchedMethod[W, ..., R, list[R]]]: ...


@overload
def dispatch(
    mode: Literal[Dispatch.DP_SPLIT, Dispatch.RANK0],
) -> Callable[[Callable[Concatenate[W, P], R]], DispatchedMethod[W, P, R, R]]: ...


def dispatch(
    mode: Dispatch,
) -> Callable[[Callable[..., Any]], DispatchedMethod[Any, ..., Any, Any]]:
    """Mark a Worker method as callable on a whole WorkerGroup, with the given dispatch mode."""
    if not isinstance(mode, Dispatch):
        raise ConfigError(
            f"@dispatch expects a Dispatch mode (e.g. Dispatch.DP_SPLIT), got {mode!r}; "
            f"choose one of {', '.join('Dispatch.' + m.name for m in Dispatch)}."
        )

    def decorate(fn: Callable[..., Any]) -> DispatchedMethod[Any, ..., Any, Any]:
        return DispatchedMethod(fn, mode)

    return decorate


def dispatched_methods(cls: type) -> dict[str, DispatchSpec]:
    """All methods of ``cls`` (and its bases) decorated with ``@dispatch``, by name."""
    found: dict[str, DispatchSpec] = {}
    for name in dir(cls):
        attr = getattr(cls, name, None)
        if isinstance(attr, DispatchedMethod):
            found[name] = DispatchSpec(name=name, mode=attr.spec.mode)
    return found


# ---------------------------------------------------------------------------- splitting inputs


def is_splittable(value: object) -> bool:
    """True for a list or an object with ``split(n)`` and a ``concat`` classmethod."""
    if isinstance(value, list):
        return True
    return callable(getattr(value, "split", None)) and callable(
        getattr(type(value), "concat", None)
    )


def split_value(value: object, n: int, where: str) -> list[object]:
    """Cut one splittable value into exactly ``n`` contiguous parts."""
    if isinstance(value, list):
        base, extra = divmod(len(value), n)
        parts: list[object] = []
        start = 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            parts.append(value[start:stop])
            start = stop
        return parts
    parts = list(value.split(n))  # type: ignore[attr-defined]
    if len(parts) != n:
        raise TrainingError(
            f"{where}: {type(value).__name__}.split({n}) returned {len(parts)} parts, expected "
            f"{n} (one per rank). split(n) must return n parts, not parts of size n."
        )
    return parts


def split_sequence(value: object, n: int, where: str) -> list[object]:
    """Check an ALL_TO_ALL argument (one item per rank) and return its items."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ConfigError(
            f"{where}: an ALL_TO_ALL argument must be a list with one item per rank "
            f"({n} items), got {type(value).__name__}."
        )
    if len(value) != n:
        raise ConfigError(
            f"{where}: an ALL_TO_ALL argument needs one item per rank: expected {n}, "
            f"got {len(value)}."
        )
    return list(value)


# --------------------------------------------------------------------------- gathering outputs


def concat_results(results: Sequence[object], where: str) -> object:
    """Put DP_SPLIT results from every rank back together, in rank order."""
    if all(r is None for r in results):
        return None
    first = results[0]
    if isinstance(first, list):
        if not all(isinstance(r, list) for r in results):
            raise TrainingError(f"{where}: some ranks returned a list and some did not.")
        return [item for r in results for item in r]  # type: ignore[attr-defined]
    concat = getattr(type(first), "concat", None)
    if callable(concat) and all(type(r) is type(first) for r in results):
        return concat(list(results))
    kinds = sorted({type(r).__name__ for r in results})
    raise TrainingError(
        f"{where}: a DP_SPLIT method must return None, a list, or an object with a concat "
        f"classmethod (e.g. TrainBatch) on every rank; got {', '.join(kinds)}. For one value "
        f"per rank (e.g. metrics) return [value], or use Dispatch.ALL_TO_ALL / ONE_TO_ALL."
    )
