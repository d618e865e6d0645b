"""The client side of agentrl's HTTP services: bearer token, a client per event loop, retries.

api = ApiClient(url, token, timeout_s=30, retries=3, backoff_s=0.5)
r = await api.send("POST", "/sessions", json={...})    # transport failures retried
if r.status_code >= 400: kind, message = api_error(r)  # the servers' {"error": {...}}
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx2

from agentrl.errors import SandboxError
from agentrl.http.guard import bearer_headers


class ApiClient:
    """httpx2 against one of these servers: a client per event loop, bearer token, retries.

    Transport failures are retried (callers make that safe with request ids); after the
    last try ``SandboxError`` says the server could not be reached.
    """

    def __init__(
        self, url: str, token: str, *, timeout_s: float, retries: int, backoff_s: float
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = bearer_headers(token)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._clients: dict[int, httpx2.AsyncClient] = {}

    def client(self) -> httpx2.AsyncClient:
        key = id(asyncio.get_running_loop())
        c = self._clients.get(key)
        if c is None or c.is_closed:
            c = self._clients[key] = httpx2.AsyncClient(
                base_url=self.url, headers=self.headers, timeout=self.timeout_s
            )
        return c

    async def send(
        self, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx2.Response:
        last: Exception | None = None
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return await self.client().request(method, path, timeout=timeout, **kwargs)
            except httpx2.TransportError as e:
                last = e
        raise SandboxError(
            f"{self.url} did not answer {method} {path} after {self.retries + 1} "
            f"tries: {type(last).__name__}: {last}"
        )

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                await c.aclose()


def api_error(r: httpx2.Response) -> tuple[str, str]:
    """(type, message) of an error answer (``("http", text)`` if it is not one of ours)."""
    try:
        err = r.json()["error"]
        return str(err["type"]), str(err["message"])
    except Exception:
        return "http", f"HTTP {r.status_code}: {r.text[:500]}"
