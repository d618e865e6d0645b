"""A lean HTTP/1.1 keep-alive client for the env service's hot path (reset, step, close).

    pool = ConnPool("http://127.0.0.1:8780", {"Authorization": "Bearer t"})
    status, content_type, body = await pool.post("/sessions/ID/step", data, extra_headers)
    await pool.aclose()                          # this loop's connections

Why not aiohttp: a rollout makes one request per env step, and on the 2 shared cores these
run on the client is the bottleneck. aiohttp spends 0.27-0.45 ms of CPU per request here
(``agentrl/inference/transport.py`` measured it), as much as the collector's own work for a
whole rollout; this client writes the request head it keeps ready and reads a
``Content-Length`` answer off an ``asyncio.Protocol``, a few tens of microseconds. It speaks
only what the env server sends (every answer has a ``Content-Length``); anything else is a
``TransportError``.

Connections are kept per event loop (the sync ``Env`` wrappers run a new loop per call; a
connection of a finished loop is never reused). A request on a reused keep-alive connection
that the server closed meanwhile (it closes idle ones after a few seconds) is sent again at
once on a fresh one; callers make that safe with request ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
import weakref
from typing import Any


class TransportError(Exception):
    """The request got no HTTP answer (refused, reset, closed, timed out)."""


class AnswerTimeout(TransportError):
    """The server took longer than the timeout to answer (the request may have run)."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, bytes]] | None = None
        self.head: tuple[int, bytes, int] | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        w = self.waiter
        if w is not None and not w.done():
            why = f": {type(exc).__name__}: {exc}" if exc is not None else ""
            w.set_exception(TransportError(f"connection closed before the answer{why}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self.waiter
        if w is None or w.done():
            self.reusable = False  # bytes nobody asked for: the stream is out of step
            return
        try:
            answer = self._parse()
        except Exception as e:
            self.reusable = False
            w.set_exception(TransportError(f"malformed HTTP answer: {e}"))
            return
        if answer is not None:
            w.set_result(answer)

    def _parse(self) -> tuple[int, bytes, bytes] | None:
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 1 << 16:
                    raise ValueError("answer head over 64 KiB")
                return None
            lines = bytes(self.buf[:end]).split(b"\r\n")
            del self.buf[: end + 4]
            status = int(lines[0].split(b" ", 2)[1])
            length, ctype = -1, b""
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"content-type":
                    ctype = value.strip()
                elif name == b"connection" and value.strip().lower() == b"close":
                    self.reusable = False
                elif name == b"transfer-encoding":
                    raise ValueError("chunked answers are not spoken here")
            if length < 0:
                if status in (204, 304) or 100 <= status < 200:
                    length = 0
                else:
                    raise ValueError(f"HTTP {status} without a Content-Length")
            self.head = (status, ctype, length)
        status, ctype, length = self.head
        if len(self.buf) < length:
            return None
        body = bytes(self.buf[:length])
        del self.buf[:length]
        self.head = None
        if self.buf:
            self.reusable = False
        return status, ctype.split(b";", 1)[0].strip(), body


def _expire(waiter: asyncio.Future[Any], timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(AnswerTimeout(f"no answer within {timeout_s:g} s"))


class ConnPool:
    """Keep-alive connections to one server, per event loop; see the module docstring."""

    def __init__(
        self, url: str, headers: dict[str, str], *, timeout_s: float, connect_timeout_s: float = 10
    ) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"env server URL {url!r} must be http://HOST[:PORT] or https://...")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None
        )
        self.base = u.path.rstrip("/")
        host = u.netloc.rsplit("@", 1)[-1]
        self._head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, **headers}.items())
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Conn]] = (
            weakref.WeakKeyDictionary()
        )

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    _Conn,
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except (OSError, TimeoutError) as e:
            raise TransportError(f"cannot connect: {type(e).__name__}: {e}") from e
        return conn

    async def post(
        self, path: str, body: bytes, headers: str = "", *, timeout_s: float | None = None
    ) -> tuple[int, bytes, bytes]:
        """(status, content type, body) of ``POST path``; ``TransportError`` if none came.

        ``headers`` are extra header lines, each ending in CRLF."""
        loop = asyncio.get_running_loop()
        idle = self._idle.get(loop)
        if idle is None:
            idle = self._idle[loop] = []
        request = (
            f"POST {self.base}{path} HTTP/1.1\r\n{self._head}{headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        while idle:
            conn = idle.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                try:
                    return await self._exchange(loop, conn, request, idle, timeout_s)
                except AnswerTimeout:
                    raise
                except TransportError:
                    continue  # a stale keep-alive connection: again, on another
        conn = await self._connect(loop)
        return await self._exchange(loop, conn, request, idle, timeout_s)

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Conn,
        request: bytes,
        idle: list[_Conn],
        timeout_s: float | None,
    ) -> tuple[int, bytes, bytes]:
        assert conn.transport is not None
        waiter = conn.waiter = loop.create_future()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        timer = loop.call_later(timeout, _expire, waiter, timeout)
        try:
            conn.transport.write(request)
            answer = await waiter
        except BaseException:
            conn.reusable = False
            conn.transport.abort()
            raise
        finally:
            timer.cancel()
            conn.waiter = None
        if conn.reusable:
            idle.append(conn)
        else:
            conn.transport.close()
        return answer

    async def aclose(self) -> None:
        """Close this loop's idle connections (those of finished loops are dropped)."""
        loop = asyncio.get_running_loop()
        conns = self._idle.pop(loop, [])
        self._idle.clear()
        for conn in conns:
            if conn.transport is not None:
                with contextlib.suppress(Exception):
                    conn.transport.close()
        await asyncio.sleep(0)  # let the transports finish closing
