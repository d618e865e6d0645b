"""RemoteSandbox against a real sandbox server on loopback: auth, options, files, exec, replayed
request ids, long-lived processes (the bash tool), sweep, and use through a SandboxPool."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx2
import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import Sandbox, make_sandbox, sweep
from agentrl.sandbox_pool import SandboxPool
from agentrl.types import ToolCall
from sandboxes.remote import RemoteSandbox
from tests.toolserver.conftest import TOKEN

Server = tuple[object, str]


async def remote(url: str, **options: object) -> Sandbox:
    return await make_sandbox("remote", url=url, token=TOKEN, options=options)


async def test_auth_and_refused_options(sandbox_server: Server) -> None:
    _, url = sandbox_server
    async with httpx2.AsyncClient(base_url=url) as c:
        assert (await c.get("/health")).status_code == 200
        r = await c.post("/sandboxes", json={})
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
    with pytest.raises(SandboxError, match="refused the token"):
        await make_sandbox("remote", url=url, token="wrong")
    with pytest.raises(SandboxError, match=r"option_refused.*ro_paths"):
        await remote(url, ro_paths=["/"])
    with pytest.raises(Exception, match="url is empty"):
        await make_sandbox("remote")


async def test_files_exec_and_errors(sandbox_server: Server, tmp_path: Path) -> None:
    server, url = sandbox_server
    async with await remote(url, memory_mb=256) as sb:
        assert sb.workdir == "/workspace"
        await sb.write_file("d/a.txt", "alpha", mode=0o600)
        assert await sb.read_file("d/a.txt") == b"alpha"
        r = await sb.exec(
            "stat -c %a a.txt; cat; echo $X; pwd", stdin="in", env={"X": "x"}, cwd="d"
        )
        assert r.stdout == "600\ninx\n/workspace/d\n" and r.ok and not r.timed_out
        r = await sb.exec(["sh", "-c", "echo err >&2; exit 3"])
        assert (r.exit_code, r.stderr) == (3, "err\n")
        assert (await sb.exec("sleep 10", timeout_s=0.5)).timed_out
        with pytest.raises(FileNotFoundError):
            await sb.read_file("nope.txt")
        with pytest.raises(IsADirectoryError):
            await sb.read_file("d")
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "b.txt").write_text("beta")
        await sb.upload(src, "up")
        await sb.upload(src / "sub" / "b.txt", "single.txt")
        assert (await sb.exec("cat up/sub/b.txt single.txt")).stdout == "betabeta"
        await sb.download("up", tmp_path / "back")
        await sb.download("d/a.txt", tmp_path / "a.txt")
        assert (tmp_path / "back" / "sub" / "b.txt").read_text() == "beta"
        assert (tmp_path / "a.txt").read_text() == "alpha"
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")
    assert server.entries == {}


async def test_retried_exec_request_runs_once(sandbox_server: Server) -> None:
    _, url = sandbox_server
    sb = await remote(url)
    assert isinstance(sb, RemoteSandbox)
    body = {"cmd": "echo run >> log; wc -l < log", "request_id": uuid.uuid4().hex}
    headers = {"Authorization": f"Bearer {TOKEN}", **sb._headers}  # + the sandbox's own token
    async with httpx2.AsyncClient(base_url=url, headers=headers) as c:
        first = (await c.post(f"/sandboxes/{sb.id}/exec", json=body)).json()
        again = (await c.post(f"/sandboxes/{sb.id}/exec", json=body)).json()
        r = await c.post("/sandboxes/nope/exec", json=body)
        assert r.status_code == 404 and r.json()["error"]["type"] == "unknown_sandbox"
    assert first == again and first["stdout"] == "1\n"
    assert (await sb.read_file("log")) == b"run\n"
    await sb.close()


async def test_bash_tool_runs_on_a_remote_sandbox(sandbox_server: Server) -> None:
    from tools.swe import swe_toolset

    _, url = sandbox_server
    tools = swe_toolset()
    async with await remote(url) as sb:

        async def bash(cmd: str, **kw: object) -> str:
            res = await tools.call(
                ToolCall(name="bash", arguments={"command": cmd, **kw}), sandbox=sb
            )
            return res.content

        assert await bash("mkdir -p w && cd w && export V=42") == "[no output]"
        assert await bash("pwd; echo $V") == "/workspace/w\n42\n"
        out = await bash("sleep 30", timeout=1)
        assert "timed out" in out
        assert await bash("echo after") == "after\n"


async def test_sweep_closes_a_runs_sandboxes(sandbox_server: Server) -> None:
    server, url = sandbox_server
    cfg = RemoteSandbox.Config(url=url, token=TOKEN)
    keep = await make_sandbox("remote", cfg, name="agentrl-keep-1")
    for i in range(2):
        await make_sandbox("remote", cfg, name=f"agentrl-gone-{i}")
    report = await sweep("remote", "agentrl-gone-", cfg)
    assert report.dirs == 2
    assert [e.sandbox.name for e in server.entries.values()] == ["agentrl-keep-1"]
    await keep.close()


async def test_pool_of_remote_sandboxes(sandbox_server: Server) -> None:
    server, url = sandbox_server
    cfg = RemoteSandbox.Config(url=url, token=TOKEN)
    pool = SandboxPool("remote", cfg, SandboxPool.Config(max_active=2, min_idle=1))
    async with pool, pool.acquire() as a, pool.acquire() as b:
        await a.write_file("mine", "a")
        assert (await b.exec("cat mine")).exit_code != 0
        assert a.name.startswith(pool.prefix)
    assert server.entries == {}


async def test_tool_server_on_remote_sandboxes(sandbox_server: Server) -> None:
    """Tool server -> pool of RemoteSandbox -> sandbox server: the bash tool per session."""
    from agentrl.http import ServerThread
    from agentrl.toolserver.client import RemoteToolSet
    from agentrl.toolserver.server import ToolServer
    from tools.swe import swe_toolset

    sb_server, url = sandbox_server
    cfg = ToolServer.Config(token=TOKEN, sandbox="remote")
    tool_server = ToolServer(swe_toolset(), cfg, RemoteSandbox.Config(url=url, token=TOKEN))
    with ServerThread(tool_server.app()) as tool_url:
        tools = RemoteToolSet(RemoteToolSet.Config(url=tool_url, token=TOKEN))
        async with tools.session() as s:
            call = ToolCall(name="bash", arguments={"command": "echo $((6*7)) > f; cat f"})
            assert (await s.call(call)).content == "42\n"
            assert len(sb_server.entries) == 1
        await tools.aclose()
    assert sb_server.entries == {}
