"""Keep inference servers up: notice a dead one, restart it, bring it to the current weights,
check them, and only then route requests to it again.

    check() (every check_interval_s in watch(), and on demand before a sync):
        process exited, or GET /health failed health_failures times in a row
        -> client.drain(url): no request and no weight sync goes to it from now on;
           its sticky sessions move to the other servers
        -> restart task, up to restart_attempts tries with doubling backoff:
               ServerProcess.restart()      same port, same command (backend, flags, seed)
               rejoin(url)                  the owner pushes the current weights + version
                                            and verifies them (checksums where served)
               client.admit(url)            back in routing; restarts + 1
           all tries failed -> the server stays out, ``failed`` names it, an error is logged
    SupervisedClient.generate(): when every routable server failed and a restart is under way,
        it waits for the rejoin and retries, so a rollout does not fail because its server died

``restarts`` (successful restarts) and ``failed`` go to the metrics as
``inference/server_restarts`` and ``inference/servers_failed``. The supervisor runs on the event
loop that drives the client: ``watch()`` is a task there, so it checks while that loop runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx2

from agentrl.errors import InferenceError, ServerUnavailableError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams

logger = logging.getLogger(__name__)


class SupervisedClient(InferenceClient):
    """An ``InferenceClient`` whose requests outlive a moment with no working server.

    The supervisor ``drain``s a dead server and ``admit``s it back (both ``InferenceClient``
    methods). When every routable server failed, ``generate`` awaits ``waiter`` (set by a
    ``ServerSupervisor``): True means a server came back and the request is tried again."""

    def __init__(
        self, urls: Sequence[str] | str, cfg: InferenceClient.Config | None = None
    ) -> None:
        super().__init__(urls, cfg)
        self.waiter: Callable[[], Awaitable[bool]] | None = None

    async def __aenter__(self) -> SupervisedClient:
        return self

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion:
        while True:
            seen = self.admissions
            if self.urls:
                try:
                    return await super().generate(
                        input_ids, sampling, session_id=session_id, images=images
                    )
                except ServerUnavailableError:
                    if self.waiter is None:
                        raise
                    problem = "every routable server failed"
            else:
                problem = "no server is routable"
            if self.admissions > seen:
                continue  # a server came back while this request was failing
            if self.waiter is None or not await self.waiter():
                raise ServerUnavailableError(
                    f"{problem} and no restart is under way ({len(self.drained)} drained: "
                    f"{sorted(self.drained)}); see the servers' logs."
                )


class ServerSupervisor:
    """Restarts dead servers of a ``SupervisedClient`` and rejoins them (see the module doc)."""

    @dataclass(kw_only=True)
    class Config:
        enabled: bool = True
        """False: a dead server is only failed over by the client (never restarted)."""
        check_interval_s: float = 1.0
        health_timeout_s: float = 5.0
        health_failures: int = 3
        """Consecutive failed /health checks after which a running server counts as dead."""
        restart_attempts: int = 3
        """Tries per outage (restart + rejoin) before the server is given up."""
        max_restarts: int = 10
        """Restarts per server over the supervisor's life."""
        backoff_s: float = 1.0
        """Wait before the second try; doubles each try."""
        rejoin_wait_s: float = 900.0
        """How long a request waits for a restarting server when no other one is left."""

    def __init__(
        self,
        servers: Sequence[ServerProcess],
        client: SupervisedClient,
        rejoin: Callable[[str], Awaitable[None]],
        cfg: ServerSupervisor.Config | None = None,
    ) -> None:
        self.cfg = cfg or ServerSupervisor.Config()
        self.servers = {s.url: s for s in servers}
        missing = [u for u in self.servers if u not in client.all_backends]
        if missing:
            raise InferenceError(f"supervised servers {missing} are not in the client")
        self.client = client
        self.rejoin = rejoin
        self.restarts = 0
        self.failed: set[str] = set()
        self._per_server: dict[str, int] = dict.fromkeys(self.servers, 0)
        self._misses: dict[str, int] = dict.fromkeys(self.servers, 0)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._admitted = _Signal()
        if self.cfg.enabled:
            client.waiter = self.wait_for_rejoin

    @property
    def restarting(self) -> list[str]:
        return [u for u, t in self._tasks.items() if not t.done()]

    def metrics(self) -> dict[str, float]:
        return {
            "inference/server_restarts": float(self.restarts),
            "inference/servers_restarting": float(len(self.restarting)),
            "inference/servers_failed": float(len(self.failed)),
        }

    async def watch(self) -> None:
        """Check forever (run it as a task on the client's loop; cancel it to stop)."""
        while True:
            try:
                await self.check()
            except Exception:  # keep watching; one bad round must not end supervision
                logger.exception("server check failed")
            await asyncio.sleep(self.cfg.check_interval_s)

    async def check(self) -> list[str]:
        """Drain every server found dead and start its restart; returns those urls."""
        if not self.cfg.enabled:
            return []
        idle = [u for u in self.servers if u not in self.restarting and u not in self.failed]
        dead = [u for u in idle if not self.servers[u].alive()]
        probe = [u for u in idle if u not in dead]
        healthy = await asyncio.gather(*(self._healthy(u) for u in probe))
        for url, ok in zip(probe, healthy, strict=True):
            self._misses[url] = 0 if ok else self._misses[url] + 1
            if self._misses[url] >= self.cfg.health_failures:
                dead.append(url)
        for url in dead:
            self._on_dead(url)
        return dead

    async def _healthy(self, url: str) -> bool:
        try:
            resp = await self.client.http.get(url + "/health", timeout=self.cfg.health_timeout_s)
        except httpx2.HTTPError:
            return False
        return resp.status_code == 200

    def _on_dead(self, url: str) -> None:
        if url in self.restarting or url in self.failed:
            return  # a concurrent check() got there first
        server = self.servers[url]
        why = (
            f"exited with code {server.returncode}"
            if not server.alive()
            else f"failed {self._misses[url]} health checks"
        )
        self.client.drain(url)
        self._misses[url] = 0
        if self._per_server[url] >= self.cfg.max_restarts:
            self.failed.add(url)
            logger.error(
                "inference server %s %s; it was restarted %d times already (max_restarts)"
                ", leaving it out",
                url,
                why,
                self._per_server[url],
            )
            self._admitted.fire()
            return
        logger.warning("inference server %s %s; restarting it (log: %s)", url, why, server.log_path)
        self._tasks[url] = asyncio.get_running_loop().create_task(self._restart(url))

    async def _restart(self, url: str) -> None:
        server, c = self.servers[url], self.cfg
        for attempt in range(1, c.restart_attempts + 1):
            try:
                await asyncio.to_thread(server.restart)
                await self.rejoin(url)
            except Exception as exc:
                logger.warning(
                    "restart %d/%d of %s failed: %s",
                    attempt,
                    c.restart_attempts,
                    url,
                    str(exc)[:2000],
                )
                if attempt < c.restart_attempts:
                    await asyncio.sleep(c.backoff_s * 2 ** (attempt - 1))
                continue
            self._per_server[url] += 1
            self.restarts += 1
            self.client.admit(url)
            logger.warning(
                "inference server %s is back (pid %s) and routed to again", url, server.pid
            )
            self._admitted.fire()
            return
        self.failed.add(url)
        logger.error(
            "gave up on inference server %s after %d restart attempts; see %s",
            url,
            c.restart_attempts,
            server.log_path,
        )
        self._admitted.fire()

    async def confirm_failure(self) -> list[str]:
        """After a request to a server failed: the servers found dead, checking up to
        ``health_failures + 1`` times ``check_interval_s`` apart (a SIGKILLed process may still
        be exiting, a hung one needs ``health_failures`` failed checks); [] when none is, so
        the failure was something else. Stops early once a restart is under way."""
        dead: list[str] = []
        for i in range(self.cfg.health_failures + 1):
            dead += await self.check()
            if dead or self.restarting or not self.cfg.enabled:
                break
            if i < self.cfg.health_failures:
                await asyncio.sleep(self.cfg.check_interval_s)
        return dead

    async def wait_for_rejoin(self) -> bool:
        """True once a restarted server is routed to again; False when no restart starts
        within ``health_failures + 1`` checks, when the restarts fail, or after
        ``rejoin_wait_s``. The client awaits it when every routable server failed."""
        deadline = time.monotonic() + self.cfg.rejoin_wait_s
        await self.confirm_failure()
        while self.restarting:
            try:
                await asyncio.wait_for(self._admitted.wait(), deadline - time.monotonic())
            except TimeoutError:
                return False
            if self.client.urls:
                return True
        return False

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until no restart is under way (tests, shutdown)."""
        tasks = [t for t in self._tasks.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)


@dataclass
class _Signal:
    """An event that wakes every current waiter each time it fires."""

    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wait(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def fire(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()
