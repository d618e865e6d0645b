"""Two real servers behind one InferenceClient: sticky sessions, failover, all-dead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from agentrl.errors import ServerUnavailableError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams

PROMPT = [5, 6, 7]  # greedy from here repeats one token: generations run their full length


@pytest.fixture(scope="module")
def two_servers(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("failover")
    procs = [
        ServerProcess(
            ServerProcess.Config(
                model=str(tiny_model), num_threads=1, log_path=str(logs / f"s{i}.log")
            )
        )
        for i in range(2)
    ]
    for p in procs:
        p.spawn()
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


async def running_on(url: str) -> int:
    async with httpx2.AsyncClient(trust_env=False) as http:
        return int((await http.get(url + "/get_server_info")).json()["engine"]["running"])


async def test_sticky_sessions_fail_over_then_all_dead_raises(
    two_servers: list[ServerProcess],
) -> None:
    a, b = two_servers
    sessions = [f"traj-{i}" for i in range(12)]
    short = SamplingParams(max_new_tokens=4, temperature=0)
    long = SamplingParams(max_new_tokens=600, temperature=0)
    async with InferenceClient(
        [a.url, b.url], InferenceClient.Config(down_cooldown_s=60)
    ) as client:
        turn1 = await asyncio.gather(
            *(client.generate(PROMPT, short, session_id=s) for s in sessions)
        )
        first = {s: c.server for s, c in zip(sessions, turn1, strict=True)}
        assert set(first.values()) == {a.url, b.url}  # least-load spreads new sessions
        again = await asyncio.gather(
            *(client.generate(PROMPT, short, session_id=s) for s in sessions)
        )
        assert [c.server for c in again] == [first[s] for s in sessions]  # sticky

        turn2 = [asyncio.create_task(client.generate(PROMPT, long, session_id=s)) for s in sessions]
        for _ in range(500):
            if await running_on(a.url) > 0:
                break
            await asyncio.sleep(0.01)
        a.kill()  # dies with requests in flight
        done = await asyncio.gather(*turn2)
        assert all(c.server == b.url and len(c.output_ids) == 600 for c in done)
        turn3 = await asyncio.gather(
            *(client.generate(PROMPT, short, session_id=s) for s in sessions)
        )
        assert all(c.server == b.url for c in turn3)  # re-pinned sessions stay on the survivor
        assert await client.health() == {a.url: False, b.url: True}

        b.kill()
        with pytest.raises(ServerUnavailableError, match="all 2 inference servers failed"):
            await asyncio.wait_for(
                client.generate(PROMPT, short, session_id=sessions[0]), timeout=30
            )
