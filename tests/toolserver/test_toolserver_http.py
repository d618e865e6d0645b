"""The tool server over real HTTP on loopback: auth, errors as results, timeouts, rate limits,
replayed request ids, metrics, per-session sandboxes and their cleanup."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest

from agentrl.errors import ConfigError, SandboxError, ToolError
from agentrl.http import ServerThread, check_bind
from agentrl.sandbox import Sandbox
from agentrl.tool import ToolSet
from agentrl.toolserver.client import RemoteToolSet
from agentrl.toolserver.server import ToolServer
from agentrl.types import ToolCall
from tests.sandboxes.conftest import leftovers
from tests.toolserver import toolsets
from tests.toolserver.conftest import TOKEN, serve

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SESSION_TOKENS: dict[str, str] = {}  # session id -> the token POST /sessions issued with it


def own(sid: str) -> dict[str, str]:
    """The header that proves a request comes from the session's client."""
    return {"X-Session-Token": SESSION_TOKENS.get(sid, "")}


@pytest.fixture
def basic() -> Iterator[tuple[ToolServer, str]]:
    server, thread = serve(toolsets.basic_toolset(), tool_timeouts_s={"slow": 0.3})
    yield server, thread.url
    thread.stop()


@pytest.fixture
async def http(basic: tuple[ToolServer, str]) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=basic[1], headers=AUTH, timeout=30) as c:
        yield c


async def open_session(http: httpx2.AsyncClient) -> str:
    r = await http.post("/sessions")
    assert r.status_code == 200, r.text
    sid = str(r.json()["session_id"])
    SESSION_TOKENS[sid] = r.json()["session_token"]
    return sid


async def call(
    http: httpx2.AsyncClient, sid: str, name: str, rid: str = "", **args: object
) -> dict:  # type: ignore[type-arg]
    r = await http.post(
        f"/sessions/{sid}/call",
        headers=own(sid),
        json={"name": name, "arguments": args, "request_id": rid},
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_auth_required_everywhere_but_health(basic: tuple[ToolServer, str]) -> None:
    url = basic[1]
    async with httpx2.AsyncClient(base_url=url) as c:
        assert (await c.get("/health")).status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert (await c.get(path)).status_code == 401  # unknown paths are not told apart
            r = await c.get(path, headers=AUTH)
            assert r.status_code == 404 and r.json()["error"]["type"] == "http"
        for method, path in [
            ("GET", "/tools"),
            ("POST", "/sessions"),
            ("GET", "/metrics"),
            ("POST", "/sessions/x/call"),
            ("DELETE", "/sessions/x"),
        ]:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]:
                r = await c.request(method, path, headers=headers, json={"name": "echo"})
                assert r.status_code == 401, (method, path, headers)
                assert r.json()["error"]["type"] == "unauthorized"
        r = await c.get("/tools", headers=AUTH)
        assert r.status_code == 200
        assert [t["function"]["name"] for t in r.json()] == ["echo", "add", "boom", "slow", "count"]
    bad = RemoteToolSet(RemoteToolSet.Config(url=url, token="wrong"))
    with pytest.raises(ToolError, match="refused the token"):
        await bad.refresh()
    await bad.aclose()


def test_refuses_public_bind_without_token() -> None:
    with pytest.raises(ConfigError, match=r"refusing to bind.*could run tools.*AGENTRL_TOOL_TOKEN"):
        check_bind("0.0.0.0", "", token_env="AGENTRL_TOOL_TOKEN", serves="run tools")
    check_bind("0.0.0.0", "t", token_env="AGENTRL_TOOL_TOKEN")
    check_bind("127.0.0.1", "", token_env="AGENTRL_TOOL_TOKEN")


async def test_tool_failures_are_results_not_http_errors(http: httpx2.AsyncClient) -> None:
    sid = await open_session(http)
    assert (await call(http, sid, "add", a=2, b=3))["content"] == "5"
    out = await call(http, sid, "boom", message="kaput")
    assert out["is_error"] and "ValueError: kaput" in out["content"]
    out = await call(http, sid, "add", a="two", b=3)
    assert out["is_error"] and out["metadata"]["error"] == "arguments"
    out = await call(http, sid, "ad", a=1, b=2)
    assert out["is_error"] and "Did you mean 'add'?" in out["content"]
    out = await call(http, sid, "slow", seconds=30)
    assert out["is_error"] and out["metadata"]["error"] == "timeout" and "0.3s" in out["content"]
    assert (await call(http, sid, "echo", text="still fine"))["content"] == "still fine"
    r = await http.post(f"/sessions/{sid}/call", json={"arguments": {}}, headers=own(sid))
    assert r.status_code == 422 and r.json()["error"]["type"] == "bad_request"
    r = await http.post("/sessions/nope/call", json={"name": "echo", "arguments": {"text": "x"}})
    assert r.status_code == 404 and r.json()["error"]["type"] == "unknown_session"


async def test_rate_limit_is_per_session_and_an_observation() -> None:
    _, thread = serve(toolsets.basic_toolset(), rate_per_s=0.01, burst=2)
    try:
        async with httpx2.AsyncClient(base_url=thread.url, headers=AUTH) as http:
            a, b = await open_session(http), await open_session(http)
            outs = [await call(http, a, "echo", text=str(i)) for i in range(3)]
            assert [o["is_error"] for o in outs] == [False, False, True]
            assert outs[2]["metadata"]["error"] == "rate_limited"
            assert "rate limit" in outs[2]["content"]
            assert not (await call(http, b, "echo", text="other session"))["is_error"]
            metrics = (await http.get("/metrics")).json()
            assert metrics["rate_limited"] == 1
    finally:
        thread.stop()


async def test_retried_request_id_runs_once(http: httpx2.AsyncClient) -> None:
    sid = await open_session(http)
    first = await call(http, sid, "count", rid="req-1", key="k1")
    again = await call(http, sid, "count", rid="req-1", key="k1")
    assert first["content"] == again["content"] == "1"
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert toolsets.RUNS["k1"] == 1
    # concurrent duplicates (a client retry while the first is still running) also run once
    outs = await asyncio.gather(
        *(call(http, sid, "count", rid="req-2", key="k2", delay=0.3) for _ in range(3))
    )
    assert {o["content"] for o in outs} == {"1"} and toolsets.RUNS["k2"] == 1
    assert sorted(o["replayed"] for o in outs) == [False, True, True]
    # a new id runs again; ids are per session
    assert (await call(http, sid, "count", rid="req-3", key="k1"))["content"] == "2"
    other = await open_session(http)
    assert (await call(http, other, "count", rid="req-1", key="k1"))["content"] == "3"


async def test_metrics_count_calls_errors_and_latency(http: httpx2.AsyncClient) -> None:
    sid = await open_session(http)
    await call(http, sid, "echo", text="a")
    await call(http, sid, "boom", message="b")
    await call(http, sid, "slow", seconds=5)
    m = (await http.get("/metrics")).json()
    assert m["tools"]["echo"]["calls"] == 1 and m["tools"]["echo"]["errors"] == 0
    assert m["tools"]["boom"]["errors"] == 1
    assert m["tools"]["slow"]["timeouts"] == 1 and m["tools"]["slow"]["latency_s_max"] > 0
    assert m["sessions_open"] == 1
    assert (await http.delete(f"/sessions/{sid}", headers=own(sid))).json() == {"closed": True}
    assert (await http.get("/metrics")).json()["sessions_open"] == 0


# --- sandboxed sessions ---------------------------------------------------------------------------
@pytest.fixture
def sandboxed(
    needs_local: None, sandbox_root: str, request: pytest.FixtureRequest
) -> Iterator[tuple[ToolServer, str]]:
    from sandboxes.local import LocalSandbox

    ttl = getattr(request, "param", 600.0)
    server, thread = serve(
        toolsets.sandbox_toolset(),
        LocalSandbox.Config(root_dir=sandbox_root),
        session_ttl_s=ttl,
        reap_interval_s=0.2,
    )
    yield server, thread.url
    thread.stop()
    assert list(Path(sandbox_root).iterdir()) == [], "sandboxes left behind after shutdown"


def sandboxes_of(server: ToolServer) -> list[Sandbox]:
    return [s.sandbox for s in server.sessions.values() if s.sandbox is not None]


async def test_sessions_have_isolated_sandboxes_and_are_cleaned_up(
    sandboxed: tuple[ToolServer, str],
) -> None:
    server, url = sandboxed
    tools = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN))
    assert tools.names == ["echo", "write", "shell"]
    props = [t["function"]["parameters"]["properties"] for t in tools.schemas()]
    assert all("sandbox" not in p for p in props)  # injected, hidden from the model
    async with tools.session() as a, tools.session() as b:
        sbs = sandboxes_of(server)
        assert len(sbs) == 2 and sbs[0].name != sbs[1].name
        assert not (
            await a.call(ToolCall(name="write", arguments={"path": "secret.txt", "text": "a-only"}))
        ).is_error
        seen = await b.call(
            ToolCall(
                name="shell",
                arguments={
                    "command": "cat secret.txt; find / -path /proc -prune -o -name secret.txt -print; echo done"
                },
            )
        )
        assert "a-only" not in seen.content and "secret.txt" not in seen.content.replace(
            "cat: secret.txt", ""
        )
        mine = await a.call(ToolCall(name="shell", arguments={"command": "cat secret.txt"}))
        assert mine.content == "a-only"
    assert server.sessions == {} and server.pool is not None and server.pool.stats().live == 0
    assert [x for sb in sbs for x in leftovers(sb)] == []
    await tools.aclose()


@pytest.mark.parametrize("sandboxed", [0.5], indirect=True)
async def test_idle_sessions_expire_with_their_sandbox(sandboxed: tuple[ToolServer, str]) -> None:
    server, url = sandboxed
    tools = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN, retries=0))
    s = await tools.open_session()
    [sb] = sandboxes_of(server)
    deadline = time.monotonic() + 30
    while (server.sessions or leftovers(sb)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert server.sessions == {} and leftovers(sb) == []
    with pytest.raises(SandboxError, match="unknown_session"):
        await s.call(ToolCall(name="echo", arguments={"text": "late"}))
    await tools.aclose()


async def test_sandbox_failure_is_a_sandbox_error_for_the_client(
    sandboxed: tuple[ToolServer, str],
) -> None:
    server, url = sandboxed
    tools = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN, retries=0))
    async with tools.session() as s:
        [sb] = sandboxes_of(server)
        await sb.close()  # the machinery fails under the session
        with pytest.raises(SandboxError, match="closed"):
            await s.call(ToolCall(name="shell", arguments={"command": "true"}))
    await tools.aclose()


def test_server_without_sandbox_needs_none() -> None:
    server = ToolServer(ToolSet([toolsets.echo]), ToolServer.Config())
    assert server.pool is None
    with ServerThread(server.app()) as url:
        assert httpx2.get(url + "/tools").status_code == 200  # no token configured: open (loopback)


async def test_session_of_an_env_closes_when_the_env_is_collected(
    basic: tuple[ToolServer, str],
) -> None:
    import gc

    server, url = basic
    tools = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN))

    class Episode:  # stands in for an env: one per trajectory
        pass

    a, b = Episode(), Episode()
    for env in (a, b, a):
        await tools.call(ToolCall(name="count", arguments={"key": f"ep{id(env)}"}), env=env)
    assert len(server.sessions) == 2
    assert toolsets.RUNS[f"ep{id(a)}"] == 2  # one session per env, kept across calls
    del a, env
    gc.collect()
    deadline = time.monotonic() + 30
    while len(server.sessions) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(server.sessions) == 1
    await tools.release(b)
    assert server.sessions == {}
    await tools.aclose()


class LoseFirstAnswer(httpx2.AsyncBaseTransport):
    """Delivers every request, but the answer to the first call is lost on the way back."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.lost = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/call") and not self.lost:
            await response.aread()
            self.lost += 1
            raise httpx2.ReadError("connection reset", request=request)
        return response


async def test_client_retry_after_a_lost_answer_does_not_run_twice(
    basic: tuple[ToolServer, str],
) -> None:
    server, url = basic
    tools = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN, retry_backoff_s=0.01))
    transport = LoseFirstAnswer()
    api = tools._http.api
    api._clients[id(asyncio.get_running_loop())] = httpx2.AsyncClient(
        base_url=url, headers=api.headers, transport=transport
    )
    res = await tools.call(ToolCall(name="count", arguments={"key": "lost"}))
    assert res.content == "1" and transport.lost == 1
    assert toolsets.RUNS["lost"] == 1 and server.counters["replayed"] == 1
    await tools.aclose()
