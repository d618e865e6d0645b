"""HttpGuard on the tool and sandbox servers, over real HTTP on loopback: auth is checked before
a body is read (ten unauthenticated 256 MB bodies barely move a server process's peak RSS), body
caps answer 413 with and without a Content-Length, and per-session tokens answer 403."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest

from agentrl.errors import SandboxError, ToolError
from agentrl.http import SESSION_HEADER, HttpGuard, ServerThread
from agentrl.toolserver.client import RemoteToolSet
from agentrl.toolserver.server import ToolServer
from agentrl.types import ToolCall
from tests.toolserver import toolsets
from tests.toolserver.conftest import TOKEN, serve
from tests.toolserver.test_toolserver_cli import ROOT, SERVE, free_port, wait_healthy

AUTH = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
MB = 1 << 20
PREFIX = b'{"name": "echo", "arguments": {"text": "'
SUFFIX = b'"}}'


def json_body(size_mb: int) -> Iterator[bytes]:
    """A valid call body of about ``size_mb`` MiB, streamed (the client never holds it)."""
    chunk = b"a" * MB
    yield PREFIX
    for _ in range(size_mb):
        yield chunk
    yield SUFFIX


async def ajson_body(size_mb: int) -> AsyncIterator[bytes]:
    for part in json_body(size_mb):
        yield part


def body_size(size_mb: int) -> int:
    return len(PREFIX) + size_mb * MB + len(SUFFIX)


def raw_head(url: str, head: str) -> tuple[int, bytes]:
    """Send only a request's head (its body never follows) and read the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            more = s.recv(65536)
            if not more:
                break
            data += more
    return int(data.split()[1]), data.split(b"\r\n\r\n", 1)[1]


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM): a body buffered even briefly shows here."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def tool_server_process() -> Iterator[tuple[str, int]]:
    """``agentrl tools serve`` in its own process, so its memory is its own."""
    port = free_port()
    argv = [
        sys.executable,
        "-c",
        SERVE,
        "tests.toolserver.toolsets:basic_toolset",
        "--sandbox",
        "none",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "AGENTRL_TOOL_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def test_ten_unauthenticated_256mb_bodies_are_never_read(
    tool_server_process: tuple[str, int],
) -> None:
    url, pid = tool_server_process
    with httpx2.Client(base_url=url, timeout=60) as c:
        sid = c.post("/sessions", headers=AUTH).json()["session_id"]
        assert c.post(f"/sessions/{sid}/call", content=PREFIX + b"warm" + SUFFIX).status_code == 401
        before = peak_rss_mb(pid)
        for i in range(10):  # with and without a Content-Length; no token, then a wrong one
            headers = {"content-length": str(body_size(256))} if i % 2 == 0 else {}
            if i >= 5:
                headers["Authorization"] = "Bearer wrong"
            r = c.post(f"/sessions/{sid}/call", content=json_body(256), headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error"]["type"] == "unauthorized"
        after = peak_rss_mb(pid)
    assert after - before < 50, (
        f"peak RSS grew {after - before:.0f} MB ({before:.0f} -> {after:.0f})"
    )


def test_wrong_session_token_is_refused_before_the_body(
    tool_server_process: tuple[str, int],
) -> None:
    url, pid = tool_server_process
    with httpx2.Client(base_url=url, timeout=60, headers=AUTH) as c:
        sid = c.post("/sessions").json()["session_id"]
        before = peak_rss_mb(pid)
        for token in ("", "not-the-token"):
            headers = {SESSION_HEADER: token, "content-length": str(body_size(256))}
            r = c.post(f"/sessions/{sid}/call", content=json_body(256), headers=headers)
            assert r.status_code == 403 and r.json()["error"]["type"] == "wrong_session_token"
        assert peak_rss_mb(pid) - before < 50


@pytest.fixture
def small_cap() -> Iterator[str]:
    _, thread = serve(toolsets.basic_toolset(), max_body_bytes=2 * MB)
    yield thread.url
    thread.stop()


async def test_bodies_over_the_cap_get_413_with_and_without_content_length(small_cap: str) -> None:
    async with httpx2.AsyncClient(base_url=small_cap, headers=AUTH, timeout=60) as c:
        s = (await c.post("/sessions")).json()
        own = {SESSION_HEADER: s["session_token"]}
        path = f"/sessions/{s['session_id']}/call"
        r = await c.post(path, content=b"".join(json_body(1)), headers=own)  # under the cap
        assert r.status_code == 200 and len(r.json()["content"]) == MB
        for length in (True, False):
            headers = {**own, "content-length": str(body_size(64))} if length else own
            r = await c.post(path, content=ajson_body(64), headers=headers)
            assert r.status_code == 413, (length, r.text)
            err = r.json()["error"]
            assert err["type"] == "body_too_large"
            assert f"POST {path}" in err["message"] and "at most 2 MiB" in err["message"]
            assert "max_body_bytes" in err["message"]  # says how to raise it
        # the server is fine afterwards, on the same client
        r = await c.post(path, json={"name": "add", "arguments": {"a": 1, "b": 2}}, headers=own)
        assert r.json()["content"] == "3"
    tools = RemoteToolSet(RemoteToolSet.Config(url=small_cap, token=TOKEN, retries=0))
    with pytest.raises(ToolError, match=r"at most 2 MiB"):
        await tools.call(ToolCall(name="echo", arguments={"text": "a" * (3 * MB)}))
    await tools.aclose()


async def test_sessions_are_bound_to_their_client(small_cap: str) -> None:
    a = RemoteToolSet(RemoteToolSet.Config(url=small_cap, token=TOKEN))
    b = RemoteToolSet(RemoteToolSet.Config(url=small_cap, token=TOKEN))
    sa = await a.open_session()
    sb = await b.open_session()
    assert (await sa.call(ToolCall(name="count", arguments={"key": "mine"}))).content == "1"
    # b holds the bearer token and knows a's session id, but not a's session token
    stolen = type(sa)(b._http, sa.session_id, [], "b", sb._token)
    with pytest.raises(ToolError, match="opened by another client"):
        await stolen.call(ToolCall(name="count", arguments={"key": "mine"}))
    async with httpx2.AsyncClient(base_url=small_cap, headers=AUTH) as c:
        for headers in ({}, {SESSION_HEADER: sb._token}, {SESSION_HEADER: sa._token + "x"}):
            assert (
                await c.delete(f"/sessions/{sa.session_id}", headers=headers)
            ).status_code == 403
        r = await c.post(
            f"/sessions/{sa.session_id}/call",
            headers={SESSION_HEADER: sa._token},
            json={"name": "count", "arguments": {"key": "mine"}},
        )
        assert r.status_code == 200 and r.json()["content"] == "2"
        r = await c.post("/sessions/unknown/call", json={"name": "echo"})
        assert r.status_code == 404  # an unknown session is still told apart from a wrong token
    await sa.aclose()
    await sb.aclose()
    await a.aclose()
    await b.aclose()


def test_session_tokens_can_be_turned_off() -> None:
    _, thread = serve(toolsets.basic_toolset(), session_tokens=False)
    try:
        with httpx2.Client(base_url=thread.url, headers=AUTH) as c:
            sid = c.post("/sessions").json()["session_id"]
            r = c.post(f"/sessions/{sid}/call", json={"name": "add", "arguments": {"a": 1, "b": 1}})
            assert r.json()["content"] == "2"
    finally:
        thread.stop()


def test_guard_refuses_a_negative_cap() -> None:
    app = ToolServer(toolsets.basic_toolset()).app()
    with pytest.raises(ValueError, match="must be >= 0"):
        HttpGuard(app, HttpGuard.Config(route_caps={"/x": -1}))


# --- the sandbox server -----------------------------------------------------------------------
@pytest.fixture
def capped_sandbox_server(needs_local: None, sandbox_root: str) -> Iterator[str]:
    from sandboxes.local import LocalSandbox
    from sandboxes.server import SandboxServer

    cfg = SandboxServer.Config(token=TOKEN, max_body_bytes=1 * MB, max_upload_bytes=4 * MB)
    with ServerThread(SandboxServer(cfg, LocalSandbox.Config(root_dir=sandbox_root)).app()) as url:
        yield url


async def test_sandbox_server_tokens_and_caps(capped_sandbox_server: str, tmp_path: Path) -> None:
    from agentrl.sandbox import make_sandbox
    from sandboxes.remote import RemoteSandbox

    url = capped_sandbox_server
    sb = await make_sandbox("remote", url=url, token=TOKEN)  # carries its token transparently
    other = await make_sandbox("remote", url=url, token=TOKEN)
    assert isinstance(sb, RemoteSandbox) and isinstance(other, RemoteSandbox)
    try:
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        body = {"cmd": "echo pwned", "request_id": ""}
        async with httpx2.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
            for headers in ({}, other._headers):
                r = await c.post(f"/sandboxes/{sb.id}/exec", json=body, headers=headers)
                assert r.status_code == 403 and r.json()["error"]["type"] == "wrong_sandbox_token"
            # a name in use is not handed out, even to a create without a request id
            r = await c.post("/sandboxes", json={"name": sb.name})
            assert r.status_code == 409
            # bodies: 1 MiB on most routes, 4 MiB on uploads, with or without a Content-Length;
            # a head announcing a body too large is answered before any of the body is sent
            head = f"POST /sandboxes/{sb.id}/upload?path=x HTTP/1.1\nHost: x\n"
            status, answer = raw_head(url, head + f"Content-Length: {1 << 30}\n")
            assert status == 401
            auth = (
                f"Authorization: Bearer {TOKEN}\n{SESSION_HEADER}: {sb._headers[SESSION_HEADER]}\n"
            )
            status, answer = raw_head(url, head + auth + f"Content-Length: {1 << 30}\n")
            assert status == 413 and b"at most 4 MiB" in answer and b"--max-upload-mb" in answer
            path = f"/sandboxes/{sb.id}/write_file"
            own = sb._headers
            r = await c.post(path, content=ajson_body(2), headers=own)
            assert r.status_code == 413 and "at most 1 MiB" in r.json()["error"]["message"]
        (tmp_path / "small").write_bytes(b"x" * (2 * MB))
        await sb.upload(tmp_path / "small", "small")  # over the body cap, under the upload cap
        assert (await sb.exec("wc -c < small")).stdout.strip() == str(2 * MB)
        (tmp_path / "big").write_bytes(b"x" * (5 * MB))
        with pytest.raises(SandboxError, match=r"body_too_large: .* at most 4 MiB"):
            await sb.upload(tmp_path / "big", "big")
    finally:
        await sb.close()
        await other.close()
