"""Overlapped rollouts for ``train.mode`` one_step_off and async: a producer ahead of the trainer.

    AsyncRollouts, on the Fleet's event loop (the driver thread runs it whenever it waits):
        admit()            start step s's batch when admission control allows it:
                             async         servers' weight version >= s - 1 - max_staleness
                             one_step_off  version >= s - 2 and step s-1's batch has finished
        next_batch(s)      wait for step s's groups (every admitted rollout progresses meanwhile)
        overlap(fn)        the trainer's work in a thread while the loop keeps generating
                           (overlap_s: how long of it some rollout was in flight)
        after_sync()       the version moved: admit what it now allows
        drain(timeout_s)   Ctrl-C: admit nothing more; next_batch of an admitted step waits
                           until the deadline, then raises DrainTimeout
    staleness_metrics(batch versions, loss mask, policy version, bound) -> async/staleness_*

Step s trains with the weights of version s-1 and syncs version s. A batch admitted at version v
yields tokens of version >= v (the servers apply an update between two decode steps and tag the
later tokens with the new version), so admitting step s only at v >= s-1-bound keeps every
trained token at most ``bound`` versions old, with no finished group thrown away.

Departure from completion-order buffers (as in AReaL): batches are fixed in data order - step
s trains samples [(s-1)B, sB), the samples ``sync`` trains at step s - and a step waits for the
slowest group of its own batch while later admitted batches keep generating. Taking groups in
completion order would let a long-tail group outlive the bound (it would then have to be
dropped or trained too stale); fixed batches also make ``max_staleness=0`` exactly ``sync``
and a resume exact in which samples are trained. Checkpoints hold no buffer: a resumed run
re-admits the batches that were in flight (data cursor = first untrained sample). On Ctrl-C
the driver drains: the admitted batches finish and are trained, so the checkpoint after them
has nothing in flight to lose.

With ``algo.filter_groups`` each step owns a block of ``max_filter_rounds x batch_size``
samples fixed ahead of time: its first round generates the block's first ``batch_size``,
each further round the next ones, as many as groups without signal left missing. Unused
samples of a block are never trained; the data cursor moves a whole block a step, so a
resume is still exact (``sync`` draws replacements from the cursor instead, so a filtered
``max_staleness=0`` run trains other samples than a filtered ``sync`` run).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from agentrl.errors import ConfigError, TrainingError
from agentrl.metrics_schema import (
    BUFFER_GROUPS,
    GENERATION_IDLE_S,
    IN_FLIGHT_GROUPS,
    STALENESS_MAX,
    STALENESS_MEAN,
    TRAINER_WAIT_S,
    staleness_frac_key,
)
from agentrl.types import Sample, TrajectoryGroup
from trainers.group_filter import GroupFilter

logger = logging.getLogger(__name__)
T = TypeVar("T")


class DrainTimeout(TrainingError):
    """A drained batch did not finish before ``train.drain_timeout_s``."""


class Collect(Protocol):
    """``SeededCollector.collect_ordered``: a batch's groups in sample order."""

    def __call__(
        self, samples: Sequence[Sample], on_group: Callable[[TrajectoryGroup], None] | None = None
    ) -> Awaitable[list[TrajectoryGroup]]: ...


def staleness_bound(mode: str, max_staleness: int | None) -> int:
    """How many versions old a trained token may be in ``train.mode``."""
    if mode == "sync":
        return 0
    if mode == "one_step_off":
        return 1
    if max_staleness is None:
        raise ValueError("train.mode=async needs train.max_staleness")
    return max_staleness


class AsyncRollouts:
    """Batches of steps ``first_step``..``last_step`` produced ahead of the trainer."""

    def __init__(
        self,
        *,
        mode: str,
        bound: int,
        batch_size: int,
        first_step: int,
        last_step: int,
        first_sample: int,
        sample: Callable[[int], Sample],
        collect: Collect,
        forget: Callable[[Sequence[str]], None],
        version: Callable[[], int],
        loop: asyncio.AbstractEventLoop,
        filter_rounds: int | None = None,
    ) -> None:
        """``filter_rounds``: with ``algo.filter_groups``, its ``max_filter_rounds`` (>= 1);
        None: every generated group is trained."""
        self.mode, self.bound, self.batch_size = mode, bound, batch_size
        if filter_rounds is not None and filter_rounds < 1:
            raise ConfigError(
                "algo.filter_groups in train.mode one_step_off / async needs "
                f"algo.max_filter_rounds >= 1 (got {filter_rounds}): each step's samples are a "
                "block of max_filter_rounds x train.batch_size, fixed ahead of time"
            )
        self.filter_rounds = filter_rounds
        self.stride = batch_size * (filter_rounds or 1)
        """Samples reserved per step: the data cursor moves by this much a trained step."""
        self.first_step, self.last_step, self.first_sample = first_step, last_step, first_sample
        self._sample, self._collect, self._forget = sample, collect, forget
        self._version, self.loop = version, loop
        self._tasks: dict[int, asyncio.Task[_Batch]] = {}
        self._next = first_step  # the next step to admit
        self._finished = 0  # groups finished, in every admitted batch not yet taken
        self._in_flight = 0  # groups admitted and not finished
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0
        self._closed = False
        self._drain_deadline: float | None = None  # set by drain(): Ctrl-C
        self.overlap_s = 0.0  # the last overlap(): seconds of it with rollouts in flight

    # ------------------------------------------------------------------ admission
    def admissible(self, step: int) -> bool:
        """May step ``step``'s batch start now? Admission control, the only staleness guard."""
        if self._closed or self._drain_deadline is not None or step > self.last_step:
            return False
        if self._version() < step - 1 - self.bound:
            return False
        if self.mode == "one_step_off" and step > self.first_step:
            prev = self._tasks.get(step - 1)
            return prev is None or prev.done()  # None: already taken, so finished
        return True

    def admit(self) -> None:
        """Start every batch that admission control allows now (in step order)."""
        while self.admissible(self._next):
            step, self._next = self._next, self._next + 1
            start = self.first_sample + (step - self.first_step) * self.stride
            task = self.loop.create_task(self._produce(start), name=f"rollouts-step-{step}")
            task.add_done_callback(lambda _t: self.admit())  # one_step_off: the next batch
            self._tasks[step] = task
            logger.debug("admitted step %d at weight version %d", step, self._version())

    async def _produce(self, start: int) -> _Batch:
        """One step's batch from its block of samples [start, start + stride): the first
        ``batch_size``; with filtering, then as many more as the groups without signal left
        missing, round after round (``trainers/group_filter.py``)."""
        drawn: list[Sample] = []

        async def generate(n: int) -> list[TrajectoryGroup]:
            samples = [self._sample(start + len(drawn) + i) for i in range(n)]
            drawn.extend(samples)
            self._in_flight += n
            if self._idle_since is not None:
                self._idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
            return await self._collect(samples, self._on_group)

        try:
            groups = await generate(self.batch_size)
            if self.filter_rounds is None:
                return _Batch(groups, {}, len(drawn))
            batch = GroupFilter(target=self.batch_size, max_rounds=self.filter_rounds)
            missing = batch.add(groups)
            while missing:
                missing = batch.add(await generate(missing))
            return _Batch(*batch.result(), len(drawn))
        finally:
            self._forget([s.uid for s in drawn])

    def _on_group(self, _group: TrajectoryGroup) -> None:
        self._finished += 1
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle_since = time.perf_counter()

    # ------------------------------------------------------------------ Ctrl-C
    def drain(self, timeout_s: float) -> None:
        """Admit nothing more; the admitted batches may finish within ``timeout_s``."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + timeout_s

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def admitted(self) -> list[int]:
        """The steps whose batches were admitted and not yet taken (in step order)."""
        return sorted(self._tasks)

    @property
    def in_flight_groups(self) -> int:
        return self._in_flight

    async def _wait(self, step: int, task: asyncio.Task[_Batch]) -> None:
        """Until ``task`` is done; past the drain deadline (once drain() was called), raise."""
        while not task.done():
            deadline = self._drain_deadline
            if deadline is None:
                await asyncio.wait({task}, timeout=0.5)  # drain() may come from a signal
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise DrainTimeout(
                    f"step {step}'s rollouts did not finish within train.drain_timeout_s "
                    f"({self._in_flight} groups still in flight)"
                )
            await asyncio.wait({task}, timeout=min(left, 0.5))

    # ------------------------------------------------------------------ the trainer's side
    def next_batch(self, step: int) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """Step ``step``'s groups (sample order) and the buffer's metrics when they were taken."""
        self.admit()
        task = self._tasks.get(step)
        if task is None:
            raise TrainingError(
                f"step {step}'s rollouts were never admitted (weight version {self._version()}, "
                f"{self.mode}, bound {self.bound}); the driver must sync once per step"
            )
        t0 = time.perf_counter()
        self.loop.run_until_complete(self._wait(step, task))  # interrupted: close() cancels
        del self._tasks[step]
        batch = task.result()
        wait_s = time.perf_counter() - t0
        self._finished -= batch.generated
        idle = self._idle_s + (
            time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
        )
        self._idle_s = 0.0
        if self._idle_since is not None:
            self._idle_since = time.perf_counter()
        return batch.groups, {
            **batch.metrics,
            BUFFER_GROUPS: float(self._finished),
            IN_FLIGHT_GROUPS: float(self._in_flight),
            TRAINER_WAIT_S: wait_s,
            GENERATION_IDLE_S: idle,
        }

    def overlap(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread while the event loop keeps the admitted rollouts going.
        ``overlap_s`` is then how long of it some rollout was in flight."""
        start, idle = time.perf_counter(), self._idle_now()
        try:
            return self.loop.run_until_complete(asyncio.to_thread(fn))
        finally:
            self.overlap_s = time.perf_counter() - start - (self._idle_now() - idle)

    def _idle_now(self) -> float:
        """Generation idle time since the last ``next_batch``, up to now."""
        open_s = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
        return self._idle_s + open_s

    def after_sync(self) -> None:
        """A new weight version is on the servers: admit what it allows (rollouts start when
        the loop next runs)."""
        self.admit()

    def close(self) -> None:
        """Cancel what is in flight (a resumed run re-admits it from the data cursor)."""
        self._closed = True
        pending = [t for t in self._tasks.values() if not t.done()]
        for t in pending:
            t.cancel()
        if pending and not self.loop.is_closed():
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._tasks.clear()


@dataclass(frozen=True, slots=True)
class _Batch:
    """A step's trained groups, their filter metrics and how many groups were generated."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, float]
    generated: int


class CtrlCDrain:
    """Ctrl-C during training: the first drains, the second cancels.

    ``install(rollouts)`` puts a SIGINT handler in place (main thread only; ``timeout_s`` <= 0
    leaves Ctrl-C as it is). The first Ctrl-C admits no new rollouts: in the overlapped modes
    (``rollouts`` given) the batches already admitted finish within ``timeout_s``
    (``train.drain_timeout_s``) and the driver trains them (``admitted``, ``drained``); in
    ``sync`` (``rollouts`` None) the step under way finishes, its rollouts within ``timeout_s``
    (``bounded``). Then the driver checkpoints. The second Ctrl-C raises ``KeyboardInterrupt``
    at once. The handler only sets flags, so whatever the driver is doing (an update, a
    trajectory log, a checkpoint) finishes whole.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.interrupted = False
        self.drained: list[int] = []  # the steps trained while draining
        self._rollouts: AsyncRollouts | None = None
        self._previous: Any = None
        self._deadline: float | None = None  # sync: when the step's rollouts must be done

    def install(self, rollouts: AsyncRollouts | None) -> None:
        if self.timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
            return
        self._rollouts = rollouts
        self._previous = signal.signal(signal.SIGINT, self._handler)

    def restore(self) -> None:
        """Put the previous SIGINT handler back (idempotent)."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def admitted(self, step: int) -> bool:
        """Is step ``step``'s batch admitted (so the drain trains it)?"""
        return self._rollouts is not None and step in self._rollouts.admitted()

    async def bounded(self, rollouts: Awaitable[T]) -> T:
        """``sync``: await a step's rollouts; once Ctrl-C has set the drain's deadline, past
        it cancel them and raise ``DrainTimeout``."""
        task = asyncio.ensure_future(rollouts)
        try:
            while not task.done():
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise DrainTimeout(
                        "the step's rollouts did not finish within train.drain_timeout_s "
                        f"({self.timeout_s:.0f} s)"
                    )
                await asyncio.wait({task}, timeout=0.5 if left is None else min(left, 0.5))
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _handler(self, signum: int, frame: object) -> None:
        if self.interrupted:
            self.restore()
            logger.warning("Ctrl-C again: cancelling the in-flight rollouts")
            raise KeyboardInterrupt
        self.interrupted = True
        rollouts = self._rollouts
        if rollouts is None:
            self._deadline = time.monotonic() + self.timeout_s
            logger.warning(
                "Ctrl-C: finishing the step under way (its rollouts get up to %.0f s, "
                "train.drain_timeout_s), then a checkpoint; Ctrl-C again stops now",
                self.timeout_s,
            )
            return
        steps = rollouts.admitted()
        rollouts.drain(self.timeout_s)
        logger.warning(
            "Ctrl-C: no new rollouts; waiting up to %.0f s (train.drain_timeout_s) for %d "
            "in-flight groups of %d admitted batches (steps %s), which are then trained and "
            "checkpointed; Ctrl-C again cancels them now",
            self.timeout_s,
            rollouts.in_flight_groups,
            len(steps),
            ", ".join(map(str, steps)) or "none",
        )


def staleness_metrics(
    versions: torch.Tensor, loss_mask: torch.Tensor, policy_version: int, bound: int
) -> dict[str, float]:
    """``async/staleness_*`` of a batch about to be trained by weights ``policy_version``.

    versions (B, T): the weight version of each generated token (-1 elsewhere); only loss-mask
    tokens count. Raises TrainingError past ``bound``: admission control guarantees it, so a
    breach is a bug in the driver, not a state to train through.
    """
    trained = loss_mask.bool() & (versions >= 0)
    if not trained.any():
        return {}
    stale = policy_version - versions[trained]  # (N,)
    worst = int(stale.max())
    if worst > bound or int(stale.min()) < 0:
        raise TrainingError(
            f"a trained token is {worst} weight versions old (policy {policy_version}, tokens "
            f"{int(versions[trained].min())}..{int(versions[trained].max())}), outside the "
            f"bound [0, {bound}]; admission control failed"
        )
    out = {STALENESS_MEAN: float(stale.float().mean()), STALENESS_MAX: float(worst)}
    for k in range(bound + 1):
        out[staleness_frac_key(k)] = float((stale == k).float().mean())
    return out
