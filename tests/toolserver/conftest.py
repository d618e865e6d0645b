"""Tool servers on loopback (uvicorn in a thread) and the sandbox root they use."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.http import ServerThread
from agentrl.sandbox_pool import SandboxPool
from agentrl.tool import ToolSet
from agentrl.toolserver.server import ToolServer
from tests.sandboxes.conftest import local_ready

TOKEN = "test-token-0123456789"


@pytest.fixture
def sandbox_root() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="agentrl-tstest-")
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def needs_local() -> None:
    if why := local_ready():
        pytest.skip(why)


def serve(
    tools: ToolSet, sandbox_config: object | None = None, **config: object
) -> tuple[ToolServer, ServerThread]:
    cfg = ToolServer.Config(token=TOKEN, pool=SandboxPool.Config(max_active=4), **config)  # type: ignore[arg-type]
    server = ToolServer(tools, cfg, sandbox_config)
    thread = ServerThread(server.app())
    thread.start()
    return server, thread


@pytest.fixture
def sandbox_server(needs_local: None, sandbox_root: str) -> Iterator[tuple[object, str]]:
    """A sandbox server (local backend, sandboxes under ``sandbox_root``) on loopback."""
    from sandboxes.local import LocalSandbox
    from sandboxes.server import SandboxServer

    cfg = SandboxServer.Config(token=TOKEN, reap_interval_s=0.2)
    cfg.allowed_options.append("allow_network")
    server = SandboxServer(cfg, LocalSandbox.Config(root_dir=sandbox_root))
    thread = ServerThread(server.app())
    thread.start()
    yield server, thread.url
    thread.stop()
    assert list(Path(sandbox_root).iterdir()) == [], "sandboxes left behind after shutdown"
