"""The env service: remote envs behave as local ones, images travel as bytes, sessions are
capped, shared, reaped and closed, and failures keep their kind."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx2
import pytest

from agentrl.agent import status_for
from agentrl.env import ENVS, make_env
from agentrl.envserver.client import RemoteEnv
from agentrl.envserver.server import PROTOCOL_VERSION, EnvServer
from agentrl.envserver.wire import MEDIA_TYPE, pack, unpack
from agentrl.errors import ConfigError, EnvError, EnvServerError
from agentrl.http import SESSION_HEADER
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import Message, RolloutStatus, Sample
from tests.envserver.support import OracleEnv, png, serve
from trainers.config import DataConfig, EnvEntry
from trainers.sft import demonstrations

NEEDS_SETUP = {
    "swe/Repo-v0",  # prepared repositories first; tests/agents/test_swe_agent.py
    "gui/Browser-v0",  # chromium (-m browser); tests/gui
}
BUILTIN = sorted(s.id for s in ENVS if not s.id.startswith("test-") and s.id not in NEEDS_SETUP)
ACTIONS = ["8", "up", "The answer is 4", "12", "right", "down", "3", "done", "left", "16"]


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


# --- the wire -----------------------------------------------------------------------------
def test_frames_carry_images_as_raw_bytes() -> None:
    image = png(128, 128, seed=1)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    obs = {
        "observation": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
        ]
    }
    body = pack(obs)
    assert len(body) <= 1.05 * len(image)  # base64 in JSON would be >= 1.33x
    assert image in body
    assert unpack(body) == obs
    raw = {"blob": b"\x00\x01" * 300, "n": [1, 2.5, None, "data:text/plain;base64,!!"]}
    assert unpack(pack(raw)) == raw


def test_non_canonical_data_urls_stay_text() -> None:
    odd = "data:image/png;base64," + "QQ=" * 200  # not what b64encode would write back
    assert unpack(pack({"u": odd})) == {"u": odd}
    with pytest.raises(EnvError, match="malformed frame"):
        unpack(b"{}")


# --- parity with local envs ---------------------------------------------------------------
@pytest.mark.parametrize("env_id", BUILTIN)
async def test_builtin_env_is_the_same_remotely(env_server, env_id: str) -> None:  # type: ignore[no-untyped-def]
    _, url = env_server
    for seed in (0, 1, 2):
        local, remote = make_env(env_id), make_env(f"remote:{url}/{env_id}")
        assert isinstance(remote, RemoteEnv) and remote.nondeterministic == local.nondeterministic
        assert (remote.tools is None) == (local.tools is None)
        if local.tools is not None:
            assert remote.tools is not None and remote.tools.schemas() == local.tools.schemas()
        try:
            lo, li = await local.areset(seed=seed)
            ro, ri = await remote.areset(seed=seed)
            assert (ro, ri) == (lo, li)
            assert remote.task_key(ro, ri) == local.task_key(lo, li)
            demo = local.demonstration()
            assert await remote.ademonstration() == demo
            assert remote.demonstration() == demo  # fetched once per episode, then kept
            script = [m for m in (demo or []) if m.role == "assistant"] or []
            script += [assistant(a) for a in ACTIONS]
            for action in script:
                want = await local.astep(action)
                assert await remote.astep(action) == want
                if want[2] or want[3]:
                    break
        finally:
            await local.aclose()
            await remote.aclose()


async def test_tools_run_where_the_env_runs(env_server) -> None:  # type: ignore[no-untyped-def]
    server, url = env_server
    from agentrl.types import ToolCall

    local = make_env("arith/Calculator-v0")
    remote = make_env(f"remote:{url}/arith/Calculator-v0")
    await local.areset(seed=0)
    await remote.areset(seed=0)
    assert local.tools is not None and remote.tools is not None
    for args in ({"expression": "83 * 17"}, {"expression": "1/0"}, {"nope": 1}):
        call = ToolCall(name="calculator", arguments=args)
        assert await remote.tools.call(call, env=remote) == await local.tools.call(call, env=local)
    missing = await remote.tools.call(ToolCall(name="calc", arguments={}))
    assert missing.is_error and "calculator" in missing.content
    assert 'agentrl_env_tool_calls_total{env="arith/Calculator-v0"} 4' in server.metrics_text()
    await remote.aclose()


async def test_nondeterministic_env_keeps_statuses_and_types(env_server) -> None:  # type: ignore[no-untyped-def]
    _, url = env_server
    local, remote = (
        make_env("test-envserver/Clock-v0"),
        make_env(f"remote:{url}/test-envserver/Clock-v0"),
    )
    assert remote.nondeterministic
    lo, _ = await local.areset(seed=0)
    ro, _ = await remote.areset(seed=0)
    assert [type(m) for m in ro] == [type(m) for m in lo] and ro[0].text.startswith("token ")
    assert (await remote.astep(assistant("x")))[1:] == (await local.astep(assistant("x")))[1:]
    await remote.aclose()


async def test_image_observations_cost_their_bytes_on_the_wire(env_server) -> None:  # type: ignore[no-untyped-def]
    _, url = env_server
    local, remote = (
        make_env("test-envserver/Screen-v0"),
        make_env(f"remote:{url}/test-envserver/Screen-v0"),
    )
    assert await remote.areset(seed=5) == await local.areset(seed=5)
    assert await remote.astep(assistant("go")) == await local.astep(assistant("go"))
    # the same step over raw HTTP: the body is the PNG plus a small header
    async with httpx2.AsyncClient(base_url=url) as c:
        s = (await c.post("/sessions", json={"env_id": "test-envserver/Screen-v0"})).json()
        h = {SESSION_HEADER: s["session_token"]}
        r = await c.post(f"/sessions/{s['session_id']}/reset", json={"seed": 5}, headers=h)
        assert r.headers["content-type"].startswith(MEDIA_TYPE)
        image = base64.b64decode(
            unpack(r.content)["observation"][0]["content"][1]["image_url"]["url"].split(",")[1]
        )
        assert len(r.content) <= 1.05 * len(image)
        await c.delete(f"/sessions/{s['session_id']}", headers=h)
    await remote.aclose()
    await local.aclose()


async def test_collector_trajectories_are_token_exact_remotely(env_server, chatml) -> None:  # type: ignore[no-untyped-def]
    _, url = env_server
    calls = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "83 * 17"}}\n</tool_call>'
    )

    def respond(prompt: str, turn: int) -> str:
        return [calls, "1411", "8", "up", "The answer is 1411"][turn % 5]

    async def run(prefix: str) -> list:  # type: ignore[type-arg]
        c = RolloutCollector(
            CollectorConfig(group_size=2, max_turns=4), ScriptedGenerator(chatml, respond), chatml
        )
        samples = [
            Sample(env_id=f"{prefix}{e}", seed=s, uid=f"{e}-{s}")
            for e in ("arith/Calculator-v0", "games/GuessNumber-v0", "games/GridWorld-v0")
            for s in (0, 1)
        ]
        groups = await c.collect(iter(samples))
        return sorted(
            (
                g.uid,
                t.status.value,
                t.reward,
                [s.token_ids for s in t.segments],
                [s.loss_mask for s in t.segments],
            )
            for g in groups
            for t in g.trajectories
        )

    local = await run("")
    remote = await run(f"remote:{url}/")
    assert len(local) == 12 and remote == local
    assert {r[1] for r in local} & {"completed", "truncated_max_turns"}


# --- failures keep their kind -------------------------------------------------------------
async def test_env_exceptions_keep_their_kind_remotely(env_server) -> None:  # type: ignore[no-untyped-def]
    _, url = env_server
    remote = make_env(f"remote:{url}/test-envserver/Broken-v0")
    await remote.areset(seed=0)
    with pytest.raises(EnvError, match="the env broke") as e:
        await remote.astep(assistant("x"))
    assert not isinstance(e.value, EnvServerError)
    await remote.aclose()
    with pytest.raises(ConfigError, match="does not exist"):
        make_env(f"remote:{url}/games/GuessNumber-v9")
    with pytest.raises(ConfigError, match="malformed"):
        make_env("remote:http://x/not-an-id")


async def test_auth_session_tokens_and_protocol() -> None:
    server, thread, url = serve(EnvServer.Config(token="s3cret", env_ids=["games/GuessNumber-v0"]))
    try:
        with pytest.raises(EnvServerError, match="token"):
            make_env(f"remote:{url}/games/GuessNumber-v0")
        remote = make_env(f"remote:{url}/games/GuessNumber-v0", remote={"token": "s3cret"})
        await remote.areset(seed=0)
        assert isinstance(remote, RemoteEnv) and remote.session is not None
        auth = {"Authorization": "Bearer s3cret"}
        async with httpx2.AsyncClient(base_url=url, headers=auth) as c:
            sid = remote.session.id
            r = await c.post(
                f"/sessions/{sid}/step", json={"action": {"role": "assistant", "content": "3"}}
            )
            assert r.status_code == 403  # another client's session
            r = await c.post("/sessions", json={"env_id": "games/GuessNumber-v0", "protocol": 99})
            assert r.status_code == 400 and r.json()["error"]["type"] == "protocol_mismatch"
            r = await c.post("/sessions", json={"env_id": "games/GridWorld-v0"})
            assert r.status_code == 404  # not served here
            assert (await c.get("/protocol")).json()["protocol"] == PROTOCOL_VERSION
            assert (await c.get("/health")).json()["envs"] == ["games/GuessNumber-v0"]
            listed = (await c.get("/sessions")).json()["sessions"]
            assert [s["id"] for s in listed] == [sid]
        await remote.aclose()
        assert len(server.sessions) == 0
    finally:
        thread.stop()


# --- sessions: caps, backpressure, failover, TTL ----------------------------------------------
async def test_sessions_wait_for_a_slot_then_give_up() -> None:
    server, thread, url = serve()
    try:
        cfg = {"max_sessions_per_server": 2, "acquire_timeout_s": 0.5}
        envs = [make_env(f"remote:{url}/games/GuessNumber-v0", remote=cfg) for _ in range(3)]
        await envs[0].areset(seed=0)
        await envs[1].areset(seed=1)
        third = asyncio.ensure_future(envs[2].areset(seed=2))
        await asyncio.sleep(0.2)
        assert not third.done() and len(server.sessions) == 2  # waits, does not pile up
        await envs[0].aclose()
        await asyncio.wait_for(third, 5)
        assert len(server.sessions) == 2
        with pytest.raises(EnvServerError, match="no env server had a free session"):
            await envs[0].areset(seed=0)
        for e in envs:
            await e.aclose()
        assert len(server.sessions) == 0
    finally:
        thread.stop()


async def test_a_full_server_sends_new_sessions_elsewhere() -> None:
    a, ta, ua = serve(EnvServer.Config(max_sessions=1, open_wait_s=0.0))
    b, tb, ub = serve()
    try:
        envs = [
            make_env(f"remote:{ua},{ub}/games/GridWorld-v0", remote={"max_sessions_per_server": 10})
            for _ in range(4)
        ]
        for i, e in enumerate(envs):
            await e.areset(seed=i)
        assert (len(a.sessions), len(b.sessions)) == (1, 3)
        assert a.sessions.counters["sessions_refused"] >= 1
        for e in envs:
            await e.aclose()
    finally:
        ta.stop()
        tb.stop()


async def test_failover_skips_an_unreachable_server(env_server) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens after the close
    server, url = env_server
    envs = [make_env(f"remote:{dead},{url}/games/GuessNumber-v0") for _ in range(3)]
    for e in envs:
        await e.areset(seed=0)
    assert len(server.sessions) == 3
    for e in envs:
        await e.aclose()


async def test_orphaned_sessions_are_reaped_and_the_client_is_told() -> None:
    server, thread, url = serve(EnvServer.Config(session_ttl_s=0.01, reap_interval_s=3600))
    try:
        env = make_env(f"remote:{url}/games/GuessNumber-v0")
        await env.areset(seed=0)
        await asyncio.sleep(0.05)
        assert await server.sessions.reap() == 1 and len(server.sessions) == 0
        with pytest.raises(EnvServerError, match="reaped") as e:
            await env.astep(assistant("3"))
        assert (
            status_for(e.value) is RolloutStatus.ERROR_ENV
            and RolloutStatus.ERROR_ENV.is_infra_failure
        )
        await env.aclose()
    finally:
        thread.stop()


def test_sync_wrappers_work_for_scripts_and_the_checker(env_server) -> None:  # type: ignore[no-untyped-def]
    from agentrl.env_checker import check_env_cli

    _, url = env_server
    env = make_env(f"remote:{url}/games/GuessNumber-v0")
    obs, _ = env.reset(seed=0)  # each sync call runs its own event loop
    assert env.step(assistant("8"))[0] and obs
    env.close()
    report = check_env_cli(f"remote:{url}/games/GuessNumber-v0", {})
    assert report.passed, str(report)
    json.dumps(str(report))


async def test_async_oracles_run_remotely_on_request_only(env_server) -> None:  # type: ignore[no-untyped-def]
    """An env whose oracle is async (SWE's acts in its sandbox) gives SFT demonstrations
    remotely, and a reset alone never runs the oracle (RL resets do not pay for it)."""
    _, url = env_server
    OracleEnv.oracle_calls = 0
    remote = make_env(f"remote:{url}/test-envserver/Oracle-v0")
    try:
        await remote.areset(seed=3)
        assert OracleEnv.oracle_calls == 0
        demo = await remote.ademonstration()
        assert demo is not None and OracleEnv.oracle_calls == 1
        assert remote.demonstration() == demo and OracleEnv.oracle_calls == 1  # kept
        _, reward, terminated, _, _ = await remote.astep(demo[0])
        assert reward == 1.0 and terminated
        await remote.areset(seed=4)
        assert await remote.ademonstration() != demo  # a new episode, a new oracle
    finally:
        await remote.aclose()

    data = DataConfig(envs=[EnvEntry(id=f"remote:{url}/test-envserver/Oracle-v0")], seed=0)
    convs = await asyncio.to_thread(demonstrations, data, 4)
    assert len(convs) == 4 and all(c.messages[-1].role == "assistant" for c in convs)
