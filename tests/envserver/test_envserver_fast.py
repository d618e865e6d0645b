"""The env service's fast path: a rollout is one request per reset/step, the open rides on the
first reset, closes travel in batches, the hot routes keep the guard's checks, and the
client's connections close with the pool."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from agentrl.env import make_env
from agentrl.envserver.client import EnvServerPool, RemoteConfig, RemoteEnv, close_pools
from agentrl.envserver.server import EnvServer
from agentrl.http import SESSION_HEADER, ServerThread
from agentrl.types import Message


def counted(server: EnvServer, log: list[tuple[str, str]]) -> Any:
    app = server.app()

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            log.append((scope["method"], scope["path"]))
        await app(scope, receive, send)

    return asgi


@pytest.fixture
def logged() -> Iterator[tuple[EnvServer, str, list[tuple[str, str]]]]:
    server = EnvServer(EnvServer.Config(token="t0k"))
    log: list[tuple[str, str]] = []
    thread = ServerThread(counted(server, log))
    url = thread.start()
    yield server, url, log
    thread.stop()


def remote(url: str, **cfg: Any) -> RemoteEnv:
    env = make_env(f"remote:{url}/games/GuessNumber-v0", remote={"token": "t0k", **cfg})
    assert isinstance(env, RemoteEnv)
    return env


async def test_a_rollout_is_one_request_per_reset_and_step(logged) -> None:  # type: ignore[no-untyped-def]
    server, url, log = logged
    envs = [remote(url) for _ in range(4)]
    log.clear()  # make_env's describe and handshake happen once per pool
    for i, env in enumerate(envs):
        await env.areset(seed=i)
        await env.astep(Message(role="assistant", content="8"))
    assert len(server.sessions) == 4
    await asyncio.gather(*(env.aclose() for env in envs))
    assert len(server.sessions) == 0  # closed by the time aclose returns
    opens = [p for m, p in log if p == "/sessions"]
    steps = [p for m, p in log if p.endswith("/step")]
    closes = [p for m, p in log if p == "/sessions/close"]
    assert (len(opens), len(steps), len(closes)) == (4, 4, 1) and len(log) == 9
    # a later reset of the same env is a plain reset in a new session
    await envs[0].areset(seed=9)
    assert log[-1] == ("POST", "/sessions")
    await envs[0].aclose()
    assert len(server.sessions) == 0


async def test_a_retried_open_gets_the_first_session(logged) -> None:  # type: ignore[no-untyped-def]
    server, url, _ = logged
    body = {
        "env_id": "games/GuessNumber-v0",
        "reset": {"seed": 3},
        "request_id": "open-1",
    }
    auth = {"Authorization": "Bearer t0k"}
    async with httpx2.AsyncClient(base_url=url, headers=auth) as c:
        first = await c.post("/sessions", json=body)
        again = await c.post("/sessions", json=body)
        assert first.status_code == 200 and again.content == first.content
        assert len(server.sessions) == 1
        from agentrl.envserver.wire import unpack

        out = unpack(first.content)
        assert out["reset"]["observation"] and out["session_id"] in server.sessions.sessions
        # a batched close checks each session's own token
        wrong = {"sessions": [{"id": out["session_id"], "token": "nope"}]}
        r = await c.post("/sessions/close", json=wrong)
        assert r.json() == {"closed": 0, "wrong_token": 1} and len(server.sessions) == 1
        right = {"sessions": [{"id": out["session_id"], "token": out["session_token"]}]}
        assert (await c.post("/sessions/close", json=right)).json()["closed"] == 1
        assert len(server.sessions) == 0


async def test_a_failed_reset_leaves_no_session(env_server) -> None:  # type: ignore[no-untyped-def]
    server, url = env_server
    env = make_env(f"remote:{url}/games/GuessNumber-v0")
    async with httpx2.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/sessions",
            json={"env_id": "games/GuessNumber-v0", "reset": {"seed": "x"}, "request_id": "r"},
        )
        assert r.status_code == 422 and r.json()["error"]["type"] == "bad_request"
    assert len(server.sessions) == 0
    await env.aclose()


async def test_hot_routes_keep_the_guard(logged) -> None:  # type: ignore[no-untyped-def]
    server, url, _ = logged
    env = remote(url)
    await env.areset(seed=0)
    assert env.session is not None
    step = f"/sessions/{env.session.id}/step"
    action = {"action": {"role": "assistant", "content": "3"}}
    async with httpx2.AsyncClient(base_url=url) as c:
        r = await c.post(step, json=action, headers={SESSION_HEADER: env.session.token})
        assert r.status_code == 401  # no bearer token
        auth = {"Authorization": "Bearer t0k"}
        r = await c.post(step, json=action, headers={**auth, SESSION_HEADER: "other"})
        assert r.status_code == 403
        big = json.dumps({"action": {"role": "assistant", "content": "x" * (5 << 20)}})
        r = await c.post(
            step,
            content=big,
            headers={**auth, SESSION_HEADER: env.session.token, "content-type": "application/json"},
        )
        assert r.status_code == 413
        r = await c.post(
            step, json={"nope": 1}, headers={**auth, SESSION_HEADER: env.session.token}
        )
        assert r.status_code == 422 and r.json()["error"]["type"] == "bad_request"
    assert server.stats["games/GuessNumber-v0"].steps == 0  # none of them ran
    await env.aclose()


async def test_pool_aclose_closes_connections_and_dropped_envs_are_closed(logged) -> None:  # type: ignore[no-untyped-def]
    server, url, _ = logged
    pool = EnvServerPool(RemoteConfig(servers=[url], token="t0k"))
    env = RemoteEnv("games/GuessNumber-v0", {}, pool, {})
    await env.areset(seed=0)
    dropped = RemoteEnv("games/GuessNumber-v0", {}, pool, {})
    await dropped.areset(seed=1)
    assert len(server.sessions) == 2
    del dropped
    gc.collect()  # queued for the next batched close
    await asyncio.sleep(0.05)
    assert len(server.sessions) == 1
    await env.aclose()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        await pool.aclose()
        assert not any(pool.servers[0].conn._idle.values())
    assert len(server.sessions) == 0
    await close_pools()  # the process's shared pools too (a no-op where nothing is open)
