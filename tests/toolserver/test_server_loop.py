"""The servers' event loop takes in a burst of new connections at once, even while it is busy.

A tool server's loop spends long stretches starting sandbox processes; a burst of clients
connecting meanwhile waits in the kernel's accept queue. uvloop (libuv) accepts one connection
per loop iteration, so the last of 200 waited ~10 s; asyncio's loop accepts every pending one.

The test holds the server's loop in a callback (a gate) while connections queue up, then lets
it run a few iterations and counts the connections the process has accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import psutil
import pytest
import uvicorn
from fastapi import FastAPI

from agentrl.http import SERVER_LOOP, ServerThread
from agentrl.toolserver.cli import tools_serve
from sandboxes import server as sandbox_server

BURST = 24
ITERATIONS = 3  # uvloop accepts at most this many in as many iterations


@dataclass
class Gate:
    """Holds ``loop`` inside a callback; each ``step()`` lets it run one more iteration."""

    loop: asyncio.AbstractEventLoop
    _permits: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    _entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    _open: threading.Event = field(default_factory=threading.Event)

    def _hold(self) -> None:
        self._entered.release()
        self._permits.acquire(timeout=30)
        if not self._open.is_set():
            self.loop.call_soon(self._hold)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._hold)
        assert self._entered.acquire(timeout=10), "the server's loop never ran the gate"

    def step(self) -> None:
        self._permits.release()
        assert self._entered.acquire(timeout=10), "the server's loop did not come back"

    def open(self) -> None:
        self._open.set()
        self._permits.release()


@pytest.fixture
def server() -> Iterator[tuple[asyncio.AbstractEventLoop, int]]:
    loops: list[asyncio.AbstractEventLoop] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loops.append(asyncio.get_running_loop())
        yield

    app = FastAPI(lifespan=lifespan)
    app.get("/health")(lambda: {"ok": True})
    thread = ServerThread(app)
    url = thread.start()
    yield loops[0], int(url.rsplit(":", 1)[1])
    thread.stop()


def accept_queue(port: int) -> int:
    """Connections waiting in the accept queue of the socket listening on ``port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "0A":  # LISTEN
            return int(f[4].split(":")[1], 16)  # rx_queue of a listener: its accept queue
    raise AssertionError(f"nothing listens on port {port}")


def accepted(port: int) -> int:
    """Server-side sockets of this process on ``port`` (the clients' sockets are ours too)."""
    conns = psutil.Process().net_connections(kind="tcp4")
    return sum(1 for c in conns if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_a_busy_loop_accepts_a_burst_of_connections_at_once(
    server: tuple[asyncio.AbstractEventLoop, int],
) -> None:
    loop, port = server
    gate = Gate(loop)
    socks: list[socket.socket] = []
    try:
        gate.close()
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
        deadline = time.monotonic() + 10
        while accept_queue(port) < BURST and time.monotonic() < deadline:
            time.sleep(0.01)  # the kernel finishes the handshakes
        assert accept_queue(port) == BURST and accepted(port) == 0
        for _ in range(ITERATIONS):
            gate.step()
        assert accepted(port) == BURST, "the loop accepted connections one per iteration"
    finally:
        gate.open()
        for s in socks:
            s.close()
    assert httpx2.get(f"http://127.0.0.1:{port}/health").json() == {"ok": True}


def test_the_entry_points_run_on_that_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: loops.append(kw.get("loop", "auto")))
    tools_serve("tests.toolserver.toolsets:basic_toolset")
    sandbox_server.main(["--port", "0"])
    assert loops == [SERVER_LOOP, SERVER_LOOP] == ["asyncio", "asyncio"]
