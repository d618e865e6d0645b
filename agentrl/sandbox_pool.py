"""SandboxPool: warm, capped, rate-limited sandboxes that are cleaned up on every exit path.

    async with SandboxPool("local", config=SandboxPool.Config(max_active=8, min_idle=2)) as pool:
        async with pool.acquire() as sb:     # health-checked; closed afterwards, never reused
            await sb.exec("make test", timeout_s=600)

Counting: ``live`` = idle + in use + being created, and never exceeds ``max_active`` (a hard
cap, not a hint). ``acquire`` takes an idle sandbox (health-checked, younger than ``ttl_s``) or
creates one in a free slot, waiting at most ``acquire_timeout_s``. Creations start at most
``create_rate_per_s`` per second. A refill task keeps ``min_idle`` warm; a reaper closes
sandboxes older than ``ttl_s``, in use or not. Names start with ``agentrl-{run_id}-``, so
``sweep()`` can remove what a killed run with that id left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import Sandbox, SweepReport, build_config, new_name, sandbox_class

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolStats:
    idle: int
    active: int
    live: int  # idle + active + being created
    created: int
    discarded_unhealthy: int
    expired: int


class SandboxPool:
    """Warm, capped, rate-limited sandboxes. ``async with pool.acquire() as sb`` closes ``sb``
    on every exit path (return, exception, cancellation) and frees its slot."""

    @dataclass(kw_only=True)
    class Config:
        min_idle: int = 0
        """Warm sandboxes to keep ready (never more than max_active live in total)."""
        max_active: int = 32
        """Hard cap on live sandboxes: idle + in use + being created."""
        acquire_timeout_s: float = 600.0
        """How long acquire() waits for a free slot before raising SandboxError."""
        create_rate_per_s: float = 20.0
        """At most this many sandbox creations start per second."""
        ttl_s: float = 3900.0
        """Sandboxes older than this are closed, even in use. Keep it above the rollout
        deadline plus scoring time (default: a 60 min rollout + 5 min for scoring)."""
        health_check: bool = True
        health_timeout_s: float = 10.0
        reap_interval_s: float = 10.0
        run_id: str = ""
        """Names are ``agentrl-{run_id}-...``; sweep() removes leftovers of this run id."""

        def validate(self) -> None:
            if self.max_active < 1:
                raise ConfigError(f"pool.max_active must be >= 1, got {self.max_active}")
            if not 0 <= self.min_idle <= self.max_active:
                raise ConfigError(
                    f"pool.min_idle ({self.min_idle}) must be in [0, max_active={self.max_active}]"
                )
            if self.create_rate_per_s <= 0:
                raise ConfigError(
                    f"pool.create_rate_per_s must be > 0, got {self.create_rate_per_s}"
                )

    def __init__(
        self,
        kind: str = "local",
        sandbox_config: object | None = None,
        config: Config | None = None,
    ) -> None:
        self.config = config or SandboxPool.Config()
        self.config.validate()
        self._cls = sandbox_class(kind)
        self._sb_config = build_config(self._cls, sandbox_config, {})
        self.run_id = self.config.run_id or f"{os.getpid()}{uuid.uuid4().hex[:4]}"
        self.prefix = f"agentrl-{self.run_id}-"
        self._idle: list[tuple[Sandbox, float]] = []  # (sandbox, created_at)
        self._active: dict[Sandbox, float] = {}  # in use -> created_at
        self._born: dict[Sandbox, float] = {}  # every live sandbox -> created_at (loop time)
        self._live = 0
        self._cond = asyncio.Condition()
        self._closed = False
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_create_at = 0.0
        self._rate_lock = asyncio.Lock()
        self._counts = {"created": 0, "unhealthy": 0, "expired": 0}

    # --- lifecycle -----------------------------------------------------------------------------
    async def __aenter__(self) -> SandboxPool:
        self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self.close())

    def start(self) -> None:
        """Start the warm-up and reaper tasks (acquire() does it too)."""
        if self._tasks or self._closed:
            return
        for coro in (self._refill_loop(), self._reap_loop()):
            self._tasks.add(asyncio.get_running_loop().create_task(coro))

    async def close(self) -> None:
        """Stop background tasks and close every sandbox, idle or in use. Idempotent."""
        self._closed = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        async with self._cond:
            victims = [sb for sb, _ in self._idle] + list(self._active)
            self._idle.clear()
            self._active.clear()
            self._cond.notify_all()
        await asyncio.gather(*(_close_quietly(sb) for sb in victims))

    async def sweep(self, run_id: str | None = None) -> SweepReport:
        """Remove leftovers of the run ``run_id`` (default: this pool's run)."""
        prefix = f"agentrl-{run_id}-" if run_id else self.prefix
        return await self._cls.sweep(prefix, self._sb_config)

    def stats(self) -> PoolStats:
        return PoolStats(
            idle=len(self._idle),
            active=len(self._active),
            live=self._live,
            created=self._counts["created"],
            discarded_unhealthy=self._counts["unhealthy"],
            expired=self._counts["expired"],
        )

    # --- hand-out --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """A healthy sandbox for the duration of the block; closed afterwards, never reused."""
        self.start()
        sb = await self._checkout()
        try:
            yield sb
        finally:
            task = asyncio.get_running_loop().create_task(self._discard(sb))
            await asyncio.shield(task)

    async def _checkout(self) -> Sandbox:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.acquire_timeout_s
        while True:
            idle, create = await self._wait_for_slot(deadline)
            if create:
                sb = await self._create_or_release()
            else:
                assert idle is not None
                sb = idle
                try:
                    usable = await self._usable(sb)
                except BaseException:  # cancelled mid health check: do not leak the slot
                    await asyncio.shield(self._discard(sb, active=False))
                    raise
                if not usable:
                    await self._discard(sb, active=False)
                    continue
            self._active[sb] = self._born.get(sb, loop.time())  # no await since it was made
            self._wake.set()
            return sb

    async def _wait_for_slot(self, deadline: float) -> tuple[Sandbox | None, bool]:
        loop = asyncio.get_running_loop()
        async with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                if self._idle:
                    return self._idle.pop(0)[0], False
                if self._live < self.config.max_active:
                    self._live += 1
                    return None, True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise SandboxError(
                        f"no sandbox became free within {self.config.acquire_timeout_s:.0f}s: all "
                        f"{self.config.max_active} (pool.max_active) are in use; raise "
                        "pool.max_active or pool.acquire_timeout_s, or lower rollout concurrency"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._cond.wait()

    async def _create_or_release(self) -> Sandbox:
        """Create a sandbox in a slot already counted in ``_live``; free the slot on failure."""
        try:
            return await self._create()
        except BaseException as e:
            async with self._cond:
                self._live -= 1
                self._cond.notify_all()
            if isinstance(e, Exception) and not isinstance(e, SandboxError):
                raise SandboxError(f"creating a {self._cls.kind!r} sandbox failed: {e}") from e
            raise

    async def _create(self) -> Sandbox:
        loop = asyncio.get_running_loop()
        async with self._rate_lock:
            now = loop.time()
            if self._next_create_at > now:
                await asyncio.sleep(self._next_create_at - now)
            self._next_create_at = (
                max(now, self._next_create_at) + 1.0 / self.config.create_rate_per_s
            )
        sb = await self._cls.create(self._sb_config, name=new_name(self.prefix))
        self._born[sb] = loop.time()
        self._counts["created"] += 1
        return sb

    async def _usable(self, sb: Sandbox) -> bool:
        age = asyncio.get_running_loop().time() - self._born.get(sb, 0.0)
        if age > self.config.ttl_s:
            self._counts["expired"] += 1
            return False
        if not self.config.health_check:
            return True
        try:
            async with asyncio.timeout(self.config.health_timeout_s):
                ok = await sb.is_alive()
        except TimeoutError:
            ok = False
        if not ok:
            self._counts["unhealthy"] += 1
            logger.warning("sandbox %s failed its health check; discarding it", sb.name)
        return ok

    async def _discard(self, sb: Sandbox, *, active: bool = True) -> None:
        try:
            await _close_quietly(sb)
        finally:
            async with self._cond:
                if active:
                    self._active.pop(sb, None)
                self._born.pop(sb, None)
                self._live = max(self._live - 1, 0)
                self._cond.notify_all()
            self._wake.set()

    # --- background ------------------------------------------------------------------------------
    async def _refill_loop(self) -> None:
        while not self._closed:
            self._wake.clear()
            while self._needs_warm():
                async with self._cond:
                    if not self._needs_warm():
                        break
                    self._live += 1
                try:
                    sb = await self._create_or_release()
                except SandboxError as e:
                    logger.warning("warming a sandbox failed (%s); retrying in 1s", e)
                    await asyncio.sleep(1.0)
                    continue
                self._idle.append((sb, self._born.get(sb, 0.0)))  # close() sees it from here on
                async with self._cond:
                    self._cond.notify_all()
            await self._wake.wait()

    def _needs_warm(self) -> bool:
        return (
            not self._closed
            and len(self._idle) < self.config.min_idle
            and self._live < self.config.max_active
        )

    async def _reap_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.reap_interval_s)
            now = asyncio.get_running_loop().time()
            async with self._cond:
                old_idle = [sb for sb, t in self._idle if now - t > self.config.ttl_s]
                self._idle = [(sb, t) for sb, t in self._idle if now - t <= self.config.ttl_s]
                old_active = [sb for sb, t in self._active.items() if now - t > self.config.ttl_s]
            for sb in old_active:
                logger.warning(
                    "sandbox %s outlived pool.ttl_s=%.0fs while in use; closing it",
                    sb.name,
                    self.config.ttl_s,
                )
                await _close_quietly(sb)  # the holder's next call fails; its block frees the slot
            for sb in old_idle:
                self._counts["expired"] += 1
                await self._discard(sb, active=False)


async def _close_quietly(sb: Sandbox) -> None:
    try:
        await sb.close()
    except Exception:
        logger.exception("closing sandbox %s failed", getattr(sb, "name", "?"))
