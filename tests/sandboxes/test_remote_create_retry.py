"""Creating a remote sandbox is idempotent: a create retried after a lost response (or while the
first try is still running) gets the sandbox the first try made, never a second one, and a
different request cannot take over an existing sandbox by naming it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl.http import ApiError, ServerThread
from agentrl.sandbox import make_sandbox, new_name
from tests.sandboxes.conftest import local_ready

pytestmark = pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))
TOKEN = "retry-token-0123456789"


@pytest.fixture
def root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="agentrl-retry-")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def slow_first_create(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The server's first sandbox takes 1 s longer to make (a busy host); returns the names
    of all sandboxes the server made."""
    import sandboxes.server

    made: list[str] = []

    async def slow(*args: Any, **kwargs: Any) -> Any:
        if not made:
            made.append("")  # claim the slow slot before sleeping
            await asyncio.sleep(1.0)
            made.pop()
        sb = await make_sandbox(*args, **kwargs)
        made.append(sb.name)
        return sb

    monkeypatch.setattr(sandboxes.server, "make_sandbox", slow)
    return made


def server(root: str) -> Any:
    from sandboxes.local import LocalSandbox
    from sandboxes.server import SandboxServer

    return SandboxServer(SandboxServer.Config(token=TOKEN), LocalSandbox.Config(root_dir=root))


async def test_retry_after_lost_response_gets_the_same_sandbox(
    root: str, slow_first_create: list[str]
) -> None:
    srv = server(root)
    with ServerThread(srv.app()) as url:
        # create waits 5 x http_timeout_s = 0.5 s: the first try times out (its answer is lost)
        # while the server is still making the sandbox; the client retries with the same id
        sb = await make_sandbox(
            "remote", url=url, token=TOKEN, http_timeout_s=0.1, retries=3, retry_backoff_s=0.05
        )
        try:
            assert len(slow_first_create) == 1, slow_first_create  # made once
            assert [e.sandbox.name for e in srv.entries.values()] == [sb.name]
            assert (await sb.exec("echo one", timeout_s=10)).stdout == "one\n"
        finally:
            await sb.close()
        assert srv.entries == {}


async def test_create_by_request_id(root: str) -> None:
    from sandboxes.server import CreateRequest

    srv = server(root)
    try:
        name = new_name("agentrl-retry-")
        req = CreateRequest(name=name, request_id="r1")
        (sid1, sb1), (sid2, sb2) = await asyncio.gather(srv.create(req), srv.create(req))
        assert (sid1, sb1) == (sid2, sb2) and len(srv.entries) == 1
        assert (await srv.create(req))[0] == sid1  # a later retry too
        with pytest.raises(ApiError) as taken:  # another request cannot take it over
            await srv.create(CreateRequest(name=name, request_id="r2"))
        assert taken.value.status == 409 and len(srv.entries) == 1
        other, _ = await srv.create(CreateRequest(request_id="r3"))  # no name: a fresh one
        assert other != sid1 and len(srv.entries) == 2
    finally:
        await srv.close()
    assert srv.entries == {}


async def test_failed_create_is_tried_again(root: str) -> None:
    from sandboxes.server import CreateRequest

    srv = server(root)
    try:
        bad = CreateRequest(name="bad name!", request_id="r1")
        for _ in range(2):
            with pytest.raises(ApiError, match="bad name"):
                await srv.create(bad)
        assert "r1" not in srv.creates
    finally:
        await srv.close()
