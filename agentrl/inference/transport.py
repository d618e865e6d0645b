"""The HTTP transport of ``InferenceClient.generate``: one POST, its status and body bytes.

    InferenceClient.generate -> Transport.post(url, body) -> (status, bytes)
                                connection error / timeout -> TransportFailure

Two implementations, chosen by ``InferenceClient.Config.transport``:

- ``aiohttp`` (the default): one pooled ``aiohttp.ClientSession`` per event loop, created on
  first use (a client may be built outside a loop, or used from a second one).
- ``httpx2``: the client's ``httpx2.AsyncClient`` (the one control calls and weight sync use).

Why aiohttp carries the hot path (measured, not assumed): ``python
benchmarks/rollout_overhead.py`` times clients against one loopback server that answers every
``/generate`` with a canned body, so only the client is timed. On 2 shared CPU cores, two runs
of 5 rounds: raw httpx2 spent 1.13-2.34 ms of CPU per request and needed 18-72 s to finish
2,000 requests sent at once; raw aiohttp spent 0.27-0.45 ms and needed 2.0-10.0 s; this
client on aiohttp 0.27-0.40 ms and 2.5-7.4 s (on httpx2, before: 1.57-2.33 ms, 24-53 s). The
gap is inside the libraries (the same bytes cross the same connection), so no amount of care
on top of httpx2 closes it. Control calls (pause, health, weight sync, checksums) stay on
httpx2: they are rare, and the weight-sync paths stream bodies through it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import aiohttp
import httpx2
import yarl

from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.inference.client import InferenceClient

TransportName = Literal["aiohttp", "httpx2"]
_JSON = {"content-type": "application/json"}


class TransportFailure(Exception):
    """The request got no HTTP answer (refused, reset, timed out): the server is suspect."""


class Transport(ABC):
    """POSTs one JSON body; keeps its own connection pool."""

    @abstractmethod
    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """Status and body of the answer; ``TransportFailure`` when there is none.

        A pooled keep-alive connection that the server closed just as the request went out
        (reset or disconnect before any answer) says nothing about the server's health: it is
        retried once on a fresh connection before counting as a failure."""

    @abstractmethod
    async def aclose(self) -> None: ...


class AiohttpTransport(Transport):
    """aiohttp, one session per running event loop."""

    def __init__(
        self,
        *,
        max_connections: int,
        timeout_s: float,
        connect_timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._headers = {**_JSON, **(headers or {})}  # every request (+ the bearer token)
        # Like httpx2.Timeout(timeout_s, connect=connect_timeout_s): timeout_s bounds the wait
        # for a pooled connection and each read; connect_timeout_s bounds opening a socket.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=connect_timeout_s, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._urls: dict[str, yarl.URL] = {}

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
            self._loop = loop
        return self._session

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = yarl.URL(url, encoded=True)
        session = self._session_here()
        try:
            try:
                return await _post(session, parsed, body, self._headers)
            except aiohttp.ClientConnectorError:
                raise
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                return await _post(session, parsed, body, self._headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                await session.close()


async def _post(
    session: aiohttp.ClientSession, url: yarl.URL, body: bytes, headers: Mapping[str, str]
) -> tuple[int, bytes]:
    async with session.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.read()


class Httpx2Transport(Transport):
    """The client's shared ``httpx2.AsyncClient`` (its headers, e.g. the bearer token, apply;
    closed by the client, not here)."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self._http = http

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        try:
            try:
                resp = await self._http.post(url, content=body, headers=_JSON)
            except (httpx2.ReadError, httpx2.RemoteProtocolError, httpx2.WriteError):
                resp = await self._http.post(url, content=body, headers=_JSON)
        except httpx2.TransportError as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc}") from exc
        return resp.status_code, resp.content

    async def aclose(self) -> None:
        pass


def make_transport(name: str, http: httpx2.AsyncClient, cfg: InferenceClient.Config) -> Transport:
    """The transport called ``name``, sized and timed by the client's config."""
    if name == "aiohttp":
        auth = {k: v for k, v in http.headers.items() if k.lower() == "authorization"}
        return AiohttpTransport(
            max_connections=cfg.max_connections,
            timeout_s=cfg.timeout_s,
            connect_timeout_s=cfg.connect_timeout_s,
            headers=auth,
        )
    if name == "httpx2":
        return Httpx2Transport(http)
    raise ConfigError(
        f"inference.transport must be 'aiohttp' or 'httpx2', got {name!r}; "
        "aiohttp is the default (the faster one)."
    )
