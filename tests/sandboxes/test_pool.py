"""SandboxPool: hard cap, warm sandboxes, health checks, TTL, cleanup on every exit path.

Most tests run real local sandboxes; the health-check test uses a small fake backend to make
a sandbox fail its check on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Self

import pytest

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import SANDBOXES, ExecResult, Sandbox, new_name
from agentrl.sandbox_pool import SandboxPool
from sandboxes.local import LocalSandbox
from tests.sandboxes.conftest import leftovers, local_ready

needs_local = pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))


class FakeSandbox(Sandbox):
    """In-memory stand-in: counts creations and closes; ``healthy`` drives is_alive()."""

    kind = "test-fake"
    instances: list[FakeSandbox] = []  # noqa: RUF012

    @dataclass(kw_only=True)
    class Config:
        healthy: bool = True

    def __init__(self, name: str, healthy: bool) -> None:
        self.name = name
        self.healthy = healthy
        self.closed = False

    @classmethod
    async def create(cls, config: object, *, name: str | None = None) -> Self:
        assert isinstance(config, FakeSandbox.Config)
        sb = cls(name or new_name(), config.healthy)
        FakeSandbox.instances.append(sb)
        return sb

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        return ExecResult(exit_code=0, stdout="", stderr="")

    async def read_file(self, path: str) -> bytes:
        return b""

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        pass

    async def is_alive(self) -> bool:
        return self.healthy and not self.closed

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake() -> Iterator[type[FakeSandbox]]:
    SANDBOXES.register("test-fake", FakeSandbox, override=True)
    FakeSandbox.instances = []
    yield FakeSandbox
    SANDBOXES.unregister("test-fake")


def local_config(root: str) -> LocalSandbox.Config:
    return LocalSandbox.Config(root_dir=root)


@needs_local
async def test_acquire_hands_out_a_working_sandbox_and_closes_it(sandbox_root: str) -> None:
    async with SandboxPool("local", local_config(sandbox_root)) as pool:
        async with pool.acquire() as sb:
            assert (await sb.exec("echo hi", timeout_s=10)).stdout == "hi\n"
            assert sb.name.startswith(pool.prefix)
        assert leftovers(sb) == []
        assert pool.stats().live == 0


@needs_local
async def test_hard_cap_waits_then_times_out(sandbox_root: str) -> None:
    cfg = SandboxPool.Config(max_active=2, acquire_timeout_s=0.5)
    async with SandboxPool("local", local_config(sandbox_root), cfg) as pool:
        async with pool.acquire(), pool.acquire():
            assert pool.stats().live == 2
            with pytest.raises(SandboxError, match="max_active"):
                async with pool.acquire():
                    pass
        async with pool.acquire() as sb:  # slots came back
            assert await sb.is_alive()


@needs_local
async def test_concurrency_never_exceeds_the_cap(sandbox_root: str) -> None:
    cfg = SandboxPool.Config(max_active=3, min_idle=2)
    peak = 0

    async def rollout(pool: SandboxPool) -> None:
        nonlocal peak
        async with pool.acquire() as sb:
            peak = max(peak, pool.stats().live)
            await sb.exec("true", timeout_s=10)

    async with SandboxPool("local", local_config(sandbox_root), cfg) as pool:
        await asyncio.gather(*(rollout(pool) for _ in range(10)))
        assert peak <= 3
        assert pool.stats().created >= 10


@needs_local
async def test_cleanup_on_exception_and_cancellation(sandbox_root: str) -> None:
    cfg = SandboxPool.Config(max_active=1, acquire_timeout_s=5)
    async with SandboxPool("local", local_config(sandbox_root), cfg) as pool:
        seen: list[Sandbox] = []
        with pytest.raises(RuntimeError):
            async with pool.acquire() as sb:
                seen.append(sb)
                raise RuntimeError("tool blew up")

        started = asyncio.Event()

        async def hang() -> None:
            async with pool.acquire() as sb:
                seen.append(sb)
                started.set()
                await sb.exec("sleep 1000", timeout_s=1000)

        task = asyncio.create_task(hang())
        await started.wait()
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with pool.acquire():  # the single slot is free again
            pass
        assert [x for sb in seen for x in leftovers(sb)] == []


@needs_local
async def test_min_idle_keeps_warm_sandboxes(sandbox_root: str) -> None:
    cfg = SandboxPool.Config(min_idle=2, max_active=4)
    async with SandboxPool("local", local_config(sandbox_root), cfg) as pool:
        for _ in range(100):
            if pool.stats().idle == 2:
                break
            await asyncio.sleep(0.05)
        assert pool.stats().idle == 2
    assert pool.stats().idle == 0


async def test_unhealthy_sandboxes_are_discarded(fake: type[FakeSandbox]) -> None:
    cfg = SandboxPool.Config(min_idle=1, max_active=2)
    async with SandboxPool("test-fake", config=cfg) as pool:
        for _ in range(100):
            if pool.stats().idle == 1:
                break
            await asyncio.sleep(0.01)
        fake.instances[0].healthy = False
        async with pool.acquire() as sb:
            assert sb is not fake.instances[0] and sb.healthy  # type: ignore[attr-defined]
        assert fake.instances[0].closed
        assert pool.stats().discarded_unhealthy == 1


async def test_ttl_expires_idle_and_active(fake: type[FakeSandbox]) -> None:
    cfg = SandboxPool.Config(min_idle=0, max_active=2, ttl_s=0.05, reap_interval_s=0.02)
    async with SandboxPool("test-fake", config=cfg) as pool, pool.acquire() as sb:
        for _ in range(100):
            if sb.closed:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.02)
        assert sb.closed  # type: ignore[attr-defined]


async def test_closed_pool_refuses_and_closes_everything(fake: type[FakeSandbox]) -> None:
    pool = SandboxPool("test-fake", config=SandboxPool.Config(min_idle=1))
    async with pool.acquire():
        await pool.close()
        with pytest.raises(SandboxError, match="closed"):
            async with pool.acquire():
                pass
    assert all(sb.closed for sb in fake.instances)


def test_pool_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="min_idle"):
        SandboxPool("local", config=SandboxPool.Config(min_idle=5, max_active=2))
