"""Rollout workers: the collector in Ray actors, placeable on other nodes than the trainer.

    driver (Fleet's event loop)                           Ray actors (any node)
    RolloutWorkerPool.collect_ordered(samples, on_group)
        one call per group, to the least-loaded worker -->  RolloutWorker.run_group(sample)
                                                               SeededCollector.run_group:
                                                               AgentLoops, envs, tools and
                                                               the HTTP calls to the servers
        <-- TrajectoryGroup (through the object store) ---
        groups back in sample order; on_group sees each as it lands
    routing watcher: the driver client's routable servers --> RolloutWorker.set_routable(urls)

With ``rollout_workers.num: 0`` (the default) the collector runs on the driver's event loop
as before; with ``num > 0`` every training rollout (``sync``, ``one_step_off`` and ``async``
alike) runs in a worker. Evaluation and ReMax's greedy baselines stay on the driver.

**Same samples, same tokens.** A request's sampling seed depends only on (run seed, sample
uid, member, turn) (``trainers.serving.request_seed``) and a whole group runs in one worker,
so where a rollout runs does not change what it generates: a run with workers trains the same
batches as one without (a test checks this across two Ray nodes).

**Placement.** ``resources`` are Ray custom resources each worker asks for (a node started
with ``ray start --resources='{"rollout": 8}'`` and ``resources: {rollout: 1}`` puts the
workers there); ``num_cpus`` is each worker's CPU share. A worker on another machine needs
the policy's directory at the same path (its chat template is read from there), the recipe's
``modules`` importable, and the servers' URLs reachable from it.

**Backpressure.** Admission control (``trainers.async_rollout``) bounds the batches in flight
(at most ``max_staleness + 1``, so the buffer of finished, untrained groups is bounded too);
within them, a worker holds at most ``max_groups`` groups (default: as many as its
collector's ``rollout.max_concurrency`` trajectories fill) and a group waits for a free one.

**Nothing lost.** A worker that dies (its process killed, its node gone) fails its calls with
``RayActorError``; Ray restarts it (``max_restarts``) and the pool runs each of its groups
again on a live worker, from scratch: the seeds make the retry generate what the lost attempt
would have, and the lost attempt's result never reaches the trainer, so no group is trained
twice. After ``max_retries`` failed attempts the group comes back with every member
``aborted`` (masked out of the loss, counted in ``rollout_workers/failed_groups``), never
dropped. An exception raised inside a worker (a bad env name, say) is re-raised on the
driver as what it was.

**Routing.** Each worker has its own ``SupervisedClient`` over the fleet's servers. A server
that fails there is drained by that client alone; the driver's ``ServerSupervisor`` restarts
dead servers and rejoins them (weights pushed) in the driver's client, and a watcher on the
Fleet's loop copies the driver's routable set to every worker when it changes (and at every
batch), so a worker routes to a restarted server only once it serves the current weights.
When every server failed, a worker's request waits (``rejoin_wait_s``, the supervisor's) for
the driver to route to one again, as the driver's own requests do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl import heap
from agentrl.errors import ConfigError, TrainingError
from agentrl.rollout.collector import CollectorConfig
from agentrl.types import RolloutStatus, Sample, Trajectory, TrajectoryGroup
from trainers.config import RewardConfig, RolloutWorkersConfig, RunConfig
from trainers.serving import Fleet, SeededCollector, SeededGenerator

logger = logging.getLogger(__name__)

WORKERS_ALIVE = "rollout_workers/alive"
RETRIED_GROUPS = "rollout_workers/retried_groups"
FAILED_GROUPS = "rollout_workers/failed_groups"
RESUMED_REQUESTS = "rollout_workers/resumed_requests"


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What a worker builds its collector from (everything picklable)."""

    rollout: CollectorConfig
    reward: RewardConfig  # its rubric is built in the worker
    modules: list[str]
    template_path: str
    urls: list[str]
    run_seed: int
    rejoin_wait_s: float = 0.0
    """How long a request waits, once every server failed, for the driver to route to one
    again (a restarted server rejoined); 0: it fails at once (``error_inference``)."""


class RolloutWorker:
    """One Ray actor's collector (an async actor: its groups run concurrently on its loop)."""

    def __init__(self, spec: WorkerSpec) -> None:
        from agentrl.chat import ChatTemplate
        from agentrl.inference.supervisor import SupervisedClient
        from agentrl.registry import import_modules

        import_modules(spec.modules)
        self.client = SupervisedClient(spec.urls)
        self._all = list(self.client.all_backends)  # bare urls, as the driver's client names them
        self.generator = SeededGenerator(self.client, spec.run_seed)
        self.rejoin_wait_s = spec.rejoin_wait_s
        self._routing = asyncio.Event()  # set at each set_routable
        if spec.rejoin_wait_s > 0:
            self.client.waiter = self._wait_for_server
        template = ChatTemplate.from_pretrained(spec.template_path)
        self.collector = SeededCollector(
            spec.rollout, self.generator, template, rubric=spec.reward.build_rubric()
        )
        heap.freeze()  # its loop runs rollouts: keep the start-up heap out of full GC passes

    async def run_group(self, sample: Sample) -> TrajectoryGroup:
        """Every rollout of ``sample``'s group (a failed rollout is a status, never a raise)."""
        try:
            return await self.collector.run_group(sample)
        finally:
            self.generator.forget([sample.uid])
            self.collector.forget([sample.uid])

    async def set_routable(self, urls: list[str]) -> None:
        """Route to exactly ``urls`` (the driver's routable servers) from now on."""
        routable, drained = set(urls), self.client.drained
        for url in self._all:
            if url in routable and url in drained:
                self.client.admit(url)
            elif url not in routable and url not in drained:
                self.client.drain(url)
        self._routing.set()

    async def _wait_for_server(self) -> bool:
        """The client's waiter when every server failed: True once the driver routes to a
        server again (within ``rejoin_wait_s``), as the driver's own client waits for its
        supervisor to rejoin a restarted server."""
        deadline = time.monotonic() + self.rejoin_wait_s
        while (left := deadline - time.monotonic()) > 0:
            self._routing.clear()
            try:
                await asyncio.wait_for(self._routing.wait(), left)
            except TimeoutError:
                return False
            if self.client.urls:
                return True
        return False

    async def begin_interrupt(self) -> None:
        """The driver is about to pause the servers with abort (``inference.interrupt``)."""
        self.client.begin_interrupt()

    async def end_interrupt(self) -> int:
        """The servers serve the new weights: held requests go on. Returns how many requests
        went on from partial tokens so far."""
        self.client.end_interrupt()
        return self.client.resumed_requests

    async def where(self) -> dict[str, Any]:
        """The node and process this worker runs in (for logs and tests)."""
        import os

        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def close(self) -> None:
        await self.client.aclose()


@dataclass
class _Handle:
    actor: Any
    busy: int = 0  # groups it runs now
    failed: bool = False  # its last call failed with the actor dead (until one succeeds)


class RolloutWorkerPool:
    """The driver's side: ``collect_ordered`` over Ray rollout workers (see the module doc).

    ``worker_cls`` is the actor class (``RolloutWorker``; tests pass one that misbehaves)."""

    def __init__(
        self,
        cfg: RolloutWorkersConfig,
        spec: WorkerSpec,
        *,
        routable: Callable[[], list[str]],
        loop: asyncio.AbstractEventLoop,
        worker_cls: type = RolloutWorker,
    ) -> None:
        import ray

        from agentrl.distributed.ray_utils import worker_runtime_env

        cfg.validate()
        if cfg.num < 1:
            raise ConfigError("RolloutWorkerPool needs rollout_workers.num >= 1")
        self.cfg, self.spec, self.loop = cfg, spec, loop
        self._routable = routable
        collector = spec.rollout
        self.max_groups = cfg.max_groups or -(-collector.max_concurrency // collector.group_size)
        env = worker_runtime_env()
        remote: Any = ray.remote(worker_cls).options(  # type: ignore[attr-defined]
            num_cpus=cfg.num_cpus,
            resources=dict(cfg.resources) or None,
            max_restarts=cfg.max_restarts,
            max_concurrency=max(2 * self.max_groups + 8, 16),
            **({"runtime_env": env} if env else {}),
        )
        self.workers = [_Handle(remote.remote(spec)) for _ in range(cfg.num)]
        self._free = asyncio.Condition()
        self._told: list[str] | None = None
        self.retried = 0
        self.failed = 0
        self.resumed = 0  # the workers' requests resumed after interrupts (last reported)
        self._watch: asyncio.Task[None] | None = None
        self.placement = self.loop.run_until_complete(self._start())

    @classmethod
    def for_run(cls, cfg: RunConfig, fleet: Fleet, policy_path: str | Path) -> RolloutWorkerPool:
        """Workers over ``fleet``'s servers, built as ``cfg`` says, told of every interrupting
        sync (``fleet.interrupt_hooks``)."""
        client = fleet.client
        if client is None:
            raise TrainingError("RolloutWorkerPool.for_run() before the fleet's servers started")
        restart = cfg.inference.restart
        spec = WorkerSpec(
            rollout=cfg.rollout,
            reward=cfg.reward,
            modules=list(cfg.modules),
            template_path=str(policy_path),
            urls=[f"{dialect}+{url}" for url, dialect in client.all_backends.items()],
            run_seed=cfg.seed,
            rejoin_wait_s=restart.rejoin_wait_s if restart.enabled else 0.0,
        )
        pool = cls(cfg.rollout_workers, spec, routable=lambda: client.urls, loop=fleet.loop)
        fleet.interrupt_hooks.append((pool.begin_interrupt, pool.end_interrupt))
        return pool

    async def _start(self) -> list[dict[str, Any]]:
        """Wait until every worker is up (a bad spec fails here, once, with its error), then
        start watching the driver's routing."""
        import ray

        try:
            where = list(await asyncio.gather(*(w.actor.where.remote() for w in self.workers)))
        except ray.exceptions.RayActorError as e:
            raise TrainingError(
                f"a rollout worker failed to start: {e}. Check rollout_workers.resources (does "
                f"a node offer them?), the recipe's modules and the policy path {self.spec.template_path}"
            ) from None
        await self._tell_routing(force=True)
        self._watch = self.loop.create_task(self._watch_routing(), name="rollout-worker-routing")
        nodes = sorted({p["node_id"][:8] for p in where})
        logger.info(
            "%d rollout workers up on %d Ray node(s) (%s), each running up to %d groups",
            len(where),
            len(nodes),
            ", ".join(nodes),
            self.max_groups,
        )
        return where

    # ------------------------------------------------------------------ routing
    async def _tell_routing(self, force: bool = False) -> None:
        urls = sorted(self._routable())
        if not force and urls == self._told:
            return
        self._told = urls
        await asyncio.gather(
            *(w.actor.set_routable.remote(urls) for w in self.workers), return_exceptions=True
        )

    async def _watch_routing(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.routing_interval_s)
            try:
                await self._tell_routing()
            except Exception as e:  # a worker mid-restart: told at the next change or batch
                logger.debug("telling the rollout workers the routing failed: %s", e)

    # ------------------------------------------------------------------ collection
    async def collect_ordered(
        self,
        samples: Sequence[Sample],
        on_group: Callable[[TrajectoryGroup], None] | None = None,
    ) -> list[TrajectoryGroup]:
        """Groups of ``samples`` in sample order; ``on_group`` sees each as it finishes."""
        await self._tell_routing(force=True)

        async def one(sample: Sample) -> TrajectoryGroup:
            group = await self._run_group(sample)
            if on_group is not None:
                on_group(group)
            return group

        return list(await asyncio.gather(*(one(s) for s in samples)))

    def forget(self, uids: Sequence[str]) -> None:
        """Nothing to forget here: each worker drops a group's seed counters when it ends."""

    async def _run_group(self, sample: Sample) -> TrajectoryGroup:
        import ray

        errors: list[str] = []
        for attempt in range(self.cfg.max_retries + 1):
            worker = await self._acquire()
            ref = worker.actor.run_group.remote(sample)
            try:
                group: TrajectoryGroup = await ref
                worker.failed = False
                return group
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                worker.failed = True
                self._told = None  # a restarted worker routes anywhere: tell it at the next tick
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                logger.warning(
                    "rollout worker died running group %s (attempt %d of %d); running it again",
                    sample.uid,
                    attempt + 1,
                    self.cfg.max_retries + 1,
                )
                if attempt < self.cfg.max_retries:
                    self.retried += 1
                    await asyncio.sleep(0.5 * (attempt + 1))  # room for Ray to restart it
            except ray.exceptions.RayTaskError as e:  # raised inside the worker: what it was
                raise e.as_instanceof_cause() from None
            except asyncio.CancelledError:
                ray.cancel(ref)
                raise
            finally:
                await self._release(worker)
        self.failed += 1
        error = f"rollout worker died on every attempt: {'; '.join(errors)}"
        members = [
            Trajectory(sample=sample, status=RolloutStatus.ABORTED, error=error)
            for _ in range(self.spec.rollout.group_size)
        ]
        return TrajectoryGroup(uid=sample.uid, trajectories=members)

    async def _acquire(self) -> _Handle:
        """The least busy worker with room for a group (waits while all are full)."""
        async with self._free:
            while True:
                # a worker whose last group died with it is probably restarting: others first
                worker = min(self.workers, key=lambda w: (w.failed, w.busy))
                if worker.busy < self.max_groups:
                    worker.busy += 1
                    return worker
                await self._free.wait()

    async def _release(self, worker: _Handle) -> None:
        async with self._free:
            worker.busy -= 1
            self._free.notify()

    # ------------------------------------------------------------------ interrupts
    async def begin_interrupt(self) -> None:
        """Every worker's client holds aborted requests (before the servers pause)."""
        await asyncio.gather(
            *(w.actor.begin_interrupt.remote() for w in self.workers), return_exceptions=True
        )

    async def end_interrupt(self) -> None:
        out = await asyncio.gather(
            *(w.actor.end_interrupt.remote() for w in self.workers), return_exceptions=True
        )
        self.resumed = sum(n for n in out if isinstance(n, int))

    # ------------------------------------------------------------------ metrics and close
    def metrics(self) -> dict[str, float]:
        """``rollout_workers/*``: workers whose last group did not die with them, groups run
        again, groups lost, and requests that went on from their partial tokens after an
        interrupting sync (the last three counted over the run)."""
        return {
            WORKERS_ALIVE: float(sum(not w.failed for w in self.workers)),
            RETRIED_GROUPS: float(self.retried),
            FAILED_GROUPS: float(self.failed),
            RESUMED_REQUESTS: float(self.resumed),
        }

    def close(self) -> None:
        import ray

        if self._watch is not None:
            self._watch.cancel()
            if not self.loop.is_closed() and not self.loop.is_running():
                self.loop.run_until_complete(asyncio.gather(self._watch, return_exceptions=True))
            self._watch = None
        refs = [w.actor.close.remote() for w in self.workers]
        ray.wait(refs, num_returns=len(refs), timeout=10.0)
        for w in self.workers:
            ray.kill(w.actor, no_restart=True)
        self.workers = []
