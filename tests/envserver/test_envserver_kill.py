"""A real env server process killed mid-rollout: its trajectories end as infrastructure
failures (error_env, masked), the ones on the other server finish as if nothing happened."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import pytest

from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Sample


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "envs",
        "serve",
        "games/GuessNumber-v0",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx2.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"env server on {port} did not start")


@pytest.fixture
def two_servers() -> Iterator[
    tuple[tuple[subprocess.Popen[bytes], str], tuple[subprocess.Popen[bytes], str]]
]:
    pa, pb = _free_port(), _free_port()
    a, b = _start(pa), _start(pb)
    yield (a, f"http://127.0.0.1:{pa}"), (b, f"http://127.0.0.1:{pb}")
    for p in (a, b):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def test_server_killed_mid_rollout(two_servers, chatml) -> None:  # type: ignore[no-untyped-def]
    (a, url_a), (_b, url_b) = two_servers
    n = 8
    arrived, killed = 0, asyncio.Event()
    on_a = 0

    async def respond(prompt: str, turn: int) -> str:
        nonlocal arrived, on_a
        if turn == 1:  # every episode has stepped once; kill A under all of them
            arrived += 1
            if arrived == n:
                on_a = len(httpx2.get(f"{url_a}/sessions").json()["sessions"])
                os.kill(a.pid, signal.SIGKILL)
                a.wait(10)
                killed.set()
            await asyncio.wait_for(killed.wait(), 60)
        return "no idea"

    gen = ScriptedGenerator(chatml, respond)
    c = RolloutCollector(
        CollectorConfig(group_size=1, max_turns=3, agent="env_driver"), gen, chatml
    )
    samples = [
        Sample(env_id=f"remote:{url_a},{url_b}/games/GuessNumber-v0", seed=i) for i in range(n)
    ]
    async with asyncio.timeout(120):
        groups = await c.collect(iter(samples))
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == n and on_a == n // 2  # least-loaded: half of the sessions on each
    failed = [t for t in trajs if t.status is RolloutStatus.ERROR_ENV]
    assert len(failed) == on_a
    for t in failed:
        assert t.status.is_infra_failure and "died" in (t.error or "") and url_a in (t.error or "")
    rest = [t for t in trajs if t not in failed]
    assert all(
        t.status is RolloutStatus.TRUNCATED_MAX_TURNS or t.status is RolloutStatus.COMPLETED
        for t in rest
    )
    assert all(len(t.turns) >= 2 for t in rest)
    # B closed every session it served; none leaked
    assert httpx2.get(f"{url_b}/sessions").json()["sessions"] == []
