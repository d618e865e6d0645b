"""The server entry points as processes: ``tools_serve`` (``agentrl tools serve``) and
``python -m sandboxes.server``, each reached over loopback by its client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import typer
from typer.testing import CliRunner

from agentrl.errors import ConfigError
from agentrl.toolserver.cli import load_toolset, tools_serve
from agentrl.toolserver.client import RemoteToolSet
from agentrl.types import ToolCall
from tests.toolserver.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]
SERVE = "import typer; from agentrl.toolserver.cli import tools_serve; typer.run(tools_serve)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx2.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def spawn(argv: list[str], env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([*argv, "--port", str(port)], cwd=ROOT, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def tool_server() -> Iterator[str]:
    yield from spawn(
        [sys.executable, "-c", SERVE, "tests.toolserver.toolsets:basic_toolset"],
        {"AGENTRL_TOOL_TOKEN": TOKEN},
    )


async def test_tools_serve_in_a_process(tool_server: str) -> None:
    assert httpx2.get(tool_server + "/tools").status_code == 401
    tools = RemoteToolSet(RemoteToolSet.Config(url=tool_server, token=TOKEN))
    assert (await tools.call(ToolCall(name="add", arguments={"a": 1, "b": 2}))).content == "3"
    await tools.aclose()


def test_tools_serve_refuses_public_bind_without_token() -> None:
    app = typer.Typer()
    app.command()(tools_serve)
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_TOOL_TOKEN"}
    r = CliRunner(env=env).invoke(
        app, ["tests.toolserver.toolsets:basic_toolset", "--host", "0.0.0.0"]
    )
    assert isinstance(r.exception, ConfigError) and "refusing to bind" in str(r.exception)


def test_load_toolset_errors() -> None:
    assert load_toolset("tests.toolserver.toolsets:basic_toolset").name == "basic"
    with pytest.raises(ConfigError, match="MODULE:TOOLSET_FACTORY"):
        load_toolset("tests.toolserver.toolsets")
    with pytest.raises(ConfigError, match="must be a ToolSet"):
        load_toolset("tests.toolserver.toolsets:RUNS")


async def test_sandbox_server_in_a_process(needs_local: None, sandbox_root: str) -> None:
    from agentrl.sandbox import make_sandbox

    argv = [sys.executable, "-m", "sandboxes.server", "--token", TOKEN]
    for url in spawn(argv, {"TMPDIR": sandbox_root}):
        async with await make_sandbox("remote", url=url, token=TOKEN) as sb:
            assert (await sb.exec("echo $((6 * 7))")).stdout == "42\n"
