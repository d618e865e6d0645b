"""RemoteToolSet: a ToolSet whose tools run on a tool server, one server session per trajectory.

    tools = RemoteToolSet(RemoteToolSet.Config(url="http://127.0.0.1:8770", token="s3cret"))
    env.tools = tools                                   # schemas() and call() as for a ToolSet
    result = await tools.call(tool_call, env=env)       # session of this env, opened on first use

    async with tools.session() as s:                    # or own the session's lifetime
        await s.call(tool_call)

How data moves: ``call(tool_call, env=...)`` finds the session of the trajectory (keyed by the
injected ``env``, which AgentLoops and ``Env.acall_tools`` pass; one env per trajectory),
opening one with ``POST /sessions`` on first use (the answer carries the session's token,
sent back in ``X-Session-Token`` with every request about the session) ->
``POST /sessions/{id}/call`` with a fresh ``request_id`` -> ``ToolResult``. A transport failure is retried with the same
request id (the server answers a retry from its cache, so a tool never runs twice). The
session is closed when its env is garbage-collected, by ``release(env)`` or ``aclose()``,
and otherwise by the server's idle TTL. Without an injected env all calls share one session.

Errors: tool failures, timeouts and rate limits are ``ToolResult(is_error=True)`` as locally;
an unreachable server, an expired session or a sandbox failure raise ``SandboxError``
(-> ``RolloutStatus.ERROR_SANDBOX``); a refused token (401, or 403 for a session's token)
and a body over the server's cap (413) raise ``ToolError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2

from agentrl.errors import SandboxError, ToolError
from agentrl.http import SESSION_HEADER, ApiClient, api_error
from agentrl.tool import Tool, ToolResult, ToolSet
from agentrl.types import JSON, ToolCall

logger = logging.getLogger(__name__)

TOKEN_ENV = "AGENTRL_TOOL_TOKEN"
"""The environment variable holding the tool server's bearer token (server and client)."""


class SchemaTool(Tool):
    """A tool known only by its schema; ``call`` goes through ``runner`` (remote or MCP)."""

    def __init__(self, schema: JSON, runner: Any) -> None:
        fn = schema.get("function", schema)
        self.name = str(fn["name"])
        self.description = str(fn.get("description") or "")
        self.parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        self.inject = ()
        self.timeout_s = None
        self.is_async = True
        self._runner = runner
        self.fn = self._call_sync

    def _call_sync(self, **arguments: Any) -> Any:
        raise ToolError(f"{self.name!r} runs remotely; use `await tool.call(arguments)`")

    async def call(self, arguments: JSON, **injected: Any) -> ToolResult:
        return await self._runner(ToolCall(name=self.name, arguments=arguments))  # type: ignore[no-any-return]

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError(f"tool {self.name!r} is bound to a live connection; it cannot be pickled")


def _json_or_raise(r: httpx2.Response, url: str) -> Any:
    if r.status_code < 400:
        return r.json()
    kind, msg = api_error(r)
    if r.status_code == 401:
        raise ToolError(
            f"tool server {url} refused the token ({msg}); pass token= or set {TOKEN_ENV}"
        )
    if kind in ("tool_error", "bad_request", "wrong_session_token", "body_too_large"):
        raise ToolError(f"tool server {url}: {msg}")
    raise SandboxError(f"tool server {url}: {kind}: {msg}")


class _Http:
    def __init__(self, config: RemoteToolSet.Config) -> None:
        token = config.token or os.environ.get(TOKEN_ENV, "")
        self.api = ApiClient(
            config.url,
            token,
            timeout_s=config.timeout_s,
            retries=config.retries,
            backoff_s=config.retry_backoff_s,
        )
        self.headers = self.api.headers

    async def request(
        self, method: str, path: str, body: JSON | None = None, session_token: str = ""
    ) -> Any:
        headers = {SESSION_HEADER: session_token} if session_token else None
        r = await self.api.send(method, path, json=body, headers=headers)
        return _json_or_raise(r, self.api.url)

    async def aclose(self) -> None:
        await self.api.aclose()


class RemoteToolSession(ToolSet):
    """The tools of one server session (one trajectory's sandbox)."""

    def __init__(
        self, http: _Http, session_id: str, schemas: list[JSON], name: str, token: str = ""
    ) -> None:
        super().__init__(name=name)
        self._http = http
        self.session_id = session_id
        self._token = token  # the session's own token (X-Session-Token)
        self.closed = False
        for schema in schemas:
            self.add(SchemaTool(schema, self.call))

    async def call(self, tool_call: ToolCall, **injected: Any) -> ToolResult:
        if self.closed:
            raise SandboxError(f"tool session {self.session_id} is closed")
        # a fresh id per call, reused by this call's retries (tool_call.id may repeat: some
        # models write their own call ids)
        body = {
            "name": tool_call.name,
            "arguments": tool_call.arguments,
            "request_id": uuid.uuid4().hex,
        }
        out = await self._http.request(
            "POST", f"/sessions/{self.session_id}/call", body, self._token
        )
        meta = out.get("metadata") or {}
        return ToolResult(
            content=str(out["content"]),
            is_error=bool(out["is_error"]),
            metadata=meta if isinstance(meta, dict) else {"value": meta},
        )

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._http.request("DELETE", f"/sessions/{self.session_id}", None, self._token)
        except Exception as e:  # the server's TTL closes it anyway
            logger.warning("closing tool session %s failed: %s", self.session_id, e)


class RemoteToolSet(ToolSet):
    """A ToolSet served by ``agentrl tools serve``; see the module docstring."""

    @dataclass(kw_only=True)
    class Config:
        url: str
        """Base URL of the tool server, e.g. http://127.0.0.1:8770."""
        token: str = ""
        """Bearer token ("" = the AGENTRL_TOOL_TOKEN environment variable, if set)."""
        timeout_s: float = 900.0
        """HTTP timeout per request; keep it above the server's call_timeout_s."""
        retries: int = 3
        retry_backoff_s: float = 0.5

    def __init__(self, config: Config, *, name: str = "remote") -> None:
        super().__init__(name=name)
        self.config = config
        self._http = _Http(config)
        self._schemas: list[JSON] | None = None
        self._sessions: dict[int, RemoteToolSession] = {}
        self._opening: dict[int, asyncio.Future[RemoteToolSession]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    # --- what the model sees ------------------------------------------------------------------
    async def refresh(self) -> list[JSON]:
        """Fetch the tool schemas from the server (``schemas()`` does it on first use)."""
        self._set_schemas(await self._http.request("GET", "/tools"))
        return self.schemas()

    def _set_schemas(self, schemas: list[JSON]) -> None:
        self._schemas = list(schemas)
        self._tools = {}
        for s in self._schemas:
            self.add(SchemaTool(s, self.call))

    def _loaded(self) -> None:
        if self._schemas is None:  # sync callers (chat templates): one blocking fetch
            with httpx2.Client(
                base_url=self.config.url, headers=self._http.headers, timeout=self.config.timeout_s
            ) as c:
                self._set_schemas(_json_or_raise(c.get("/tools"), self.config.url))

    def schemas(self) -> list[JSON]:
        self._loaded()
        return super().schemas()

    @property
    def names(self) -> list[str]:
        self._loaded()
        return super().names

    def __len__(self) -> int:
        self._loaded()
        return super().__len__()

    def __contains__(self, name: object) -> bool:
        self._loaded()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[Tool]:
        self._loaded()
        return super().__iter__()

    def __getitem__(self, name: str) -> Tool:
        self._loaded()
        return super().__getitem__(name)

    # --- sessions -----------------------------------------------------------------------------
    async def open_session(self) -> RemoteToolSession:
        """A new server session (its own sandbox); close it with ``aclose()``."""
        if self._schemas is None:
            await self.refresh()
        out = await self._http.request("POST", "/sessions")
        return RemoteToolSession(
            self._http,
            str(out["session_id"]),
            self._schemas or [],
            self.name,
            str(out.get("session_token") or ""),
        )

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[RemoteToolSession]:
        s = await self.open_session()
        try:
            yield s
        finally:
            await asyncio.shield(s.aclose())

    async def session_for(self, owner: object) -> RemoteToolSession:
        """The session of ``owner`` (an env, one per trajectory), opened on first use."""
        key = id(owner)
        s = self._sessions.get(key)
        if s is not None:
            return s
        fut = self._opening.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = self._opening[key] = asyncio.get_running_loop().create_future()
        try:
            s = await self.open_session()
        except BaseException as e:
            if isinstance(e, Exception):
                fut.set_exception(e)
                fut.exception()  # waiters re-raise it; nobody else must
            else:
                fut.cancel()
            raise
        finally:
            self._opening.pop(key, None)
        self._sessions[key] = s
        fut.set_result(s)
        if owner is not self:
            self._watch(owner, key)
        return s

    def _watch(self, owner: object, key: int) -> None:
        loop = asyncio.get_running_loop()

        def close_later(s: RemoteToolSession) -> None:
            task = loop.create_task(s.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

        def gone() -> None:  # may run in any thread, whenever the owner is collected
            s = self._sessions.pop(key, None)
            if s is not None and not loop.is_closed():
                loop.call_soon_threadsafe(close_later, s)

        try:
            weakref.finalize(owner, gone)
        except TypeError:  # not weak-referenceable: released by release() or the server's TTL
            logger.debug("%r cannot be watched; its tool session ends by TTL", owner)

    async def release(self, owner: object) -> None:
        """Close the session of ``owner`` now (an env calls this from ``aclose``)."""
        s = self._sessions.pop(id(owner), None)
        if s is not None:
            await s.aclose()

    async def call(self, tool_call: ToolCall, **injected: Any) -> ToolResult:
        owner = injected.get("env") or self
        return await (await self.session_for(owner)).call(tool_call)

    async def aclose(self) -> None:
        """Close every session this tool set opened, and its HTTP clients."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.aclose() for s in sessions))
        await self._http.aclose()
