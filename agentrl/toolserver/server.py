"""The tool server: a ToolSet over HTTP, one sandbox per session.

    server = ToolServer(swe_toolset(), ToolServer.Config(token="s3cret", sandbox="local"))
    uvicorn.run(server.app(), host="127.0.0.1", port=8770, loop=SERVER_LOOP)  # not uvloop
    # or: agentrl tools serve ...    (SERVER_LOOP: agentrl.http.service explains why)

    POST   /sessions                    -> {"session_id", "session_token", "tools"}  (+ a sandbox)
    GET    /tools                       -> [OpenAI function-tool schema, ...]
    POST   /sessions/{id}/call          {name, arguments, request_id} -> ToolResult JSON
    DELETE /sessions/{id}               closes the session and its sandbox
    GET    /health (no auth)            GET /metrics -> calls, errors, latency per tool

How a call moves: ``HttpGuard`` (``agentrl.http.guard``), before the body is read: bearer
token (401), the session's token in ``X-Session-Token`` (403; per-session tokens are on by
default, so one client cannot drive another's sandbox), the body cap (413) -> the session
(404 if unknown or expired) -> the replay cache
(a request_id seen before returns its first answer; nothing runs twice) -> the session's token
bucket (over the limit: an error result the model reads) -> ``ToolSet.call`` with the session's
sandbox injected, under the tool's timeout -> ``ToolResult`` JSON. The model's mistakes, tool
exceptions, timeouts and rate limits come back as ``is_error`` results with HTTP 200; only the
machinery's failures are HTTP errors: a ``SandboxError`` is 502 ``sandbox_error`` (the client
raises ``SandboxError``), a wiring bug (``ToolError``) is 500 ``tool_error``.

Sessions idle longer than ``session_ttl_s`` are closed by a reaper; closing the server closes
every session and the sandbox pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Response
from pydantic import BaseModel, Field

from agentrl.errors import ConfigError, SandboxError, ToolError
from agentrl.http import (
    NO_DOCS,
    ApiError,
    HttpGuard,
    ReplayCache,
    TokenBucket,
    install_error_handlers,
)
from agentrl.http.sessions import Session as BaseSession
from agentrl.http.sessions import SessionManager
from agentrl.sandbox import Sandbox
from agentrl.sandbox_pool import SandboxPool
from agentrl.tool import ToolResult, ToolSet
from agentrl.types import JSON, ToolCall

logger = logging.getLogger(__name__)


class CallRequest(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    request_id: str = ""


@dataclass(slots=True)
class ToolStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_s_sum: float = 0.0
    latency_s_max: float = 0.0

    def to_json(self) -> JSON:
        mean = self.latency_s_sum / self.calls if self.calls else 0.0
        return {
            "calls": self.calls,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "latency_s_mean": mean,
            "latency_s_max": self.latency_s_max,
        }


@dataclass(eq=False, kw_only=True)
class Session(BaseSession):
    """A tool session: its rate limit, its replay cache and its sandbox (if the tools take one)."""

    bucket: TokenBucket
    cache: ReplayCache[ToolResult]
    sandbox: Sandbox | None = None


class ToolServer:
    """Serve ``tools`` over HTTP; each session gets its own sandbox when a tool takes one."""

    @dataclass(kw_only=True)
    class Config:
        token: str = ""
        """Bearer token required on every route but /health ("" = none; loopback only)."""
        sandbox: str = ""
        """Sandbox backend for sessions; "" = "local" if a tool takes a sandbox, "none" = never."""
        pool: SandboxPool.Config = field(default_factory=SandboxPool.Config)
        call_timeout_s: float = 300.0
        """Longest a call may run; then the model reads a timeout error."""
        tool_timeouts_s: dict[str, float] = field(default_factory=dict)
        """Per-tool overrides of call_timeout_s, by tool name."""
        rate_per_s: float = 20.0
        """Calls per second a session may make, on average (token bucket)."""
        burst: int = 40
        """Calls a session may make at once before the rate applies."""
        session_ttl_s: float = 1800.0
        """Sessions idle longer than this are closed with their sandbox."""
        max_sessions: int = 1024
        replay_cache: int = 256
        """Answers kept per session for retried request ids."""
        reap_interval_s: float = 5.0
        session_tokens: bool = True
        """Issue a token with each session and answer 403 to requests about the session
        without it (``X-Session-Token``); off, any holder of the bearer token may use any
        session."""
        max_body_bytes: int = 16 << 20
        """Largest request body (a call's arguments); larger ones get 413 unread."""

    def __init__(
        self, tools: ToolSet, config: Config | None = None, sandbox_config: object | None = None
    ) -> None:
        self.tools = tools
        self.config = config or ToolServer.Config()
        wants_sandbox = any("sandbox" in t.inject for t in tools)
        kind = self.config.sandbox or ("local" if wants_sandbox else "none")
        self.pool = SandboxPool(kind, sandbox_config, self.config.pool) if kind != "none" else None
        if wants_sandbox and self.pool is None:
            logger.warning("tools %s take a sandbox but sandbox='none'", tools.names)
        c = self.config
        self.session_manager: SessionManager[Session] = SessionManager(
            SessionManager.Config(
                max_sessions=c.max_sessions,
                session_ttl_s=c.session_ttl_s,
                reap_interval_s=c.reap_interval_s,
                session_tokens=c.session_tokens,
            ),
            kind="tool",
        )
        self.sessions = self.session_manager.sessions
        self.stats: dict[str, ToolStats] = {}
        self.counters = self.session_manager.counters
        self.counters.update(rate_limited=0, replayed=0)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self.pool is not None:
            self.pool.start()
        await self.session_manager.start()

    async def close(self) -> None:
        """Close every session and the sandbox pool."""
        await self.session_manager.close()
        if self.pool is not None:
            await self.pool.close()

    async def reap(self) -> int:
        """Close sessions idle longer than ``session_ttl_s``; returns how many."""
        return await self.session_manager.reap()

    # --- sessions (bookkeeping: agentrl.http.sessions) ------------------------------------
    async def open_session(self) -> Session:
        return await self.session_manager.open(self._make_session)

    async def _make_session(self) -> Session:
        c = self.config
        s = Session(bucket=TokenBucket(c.rate_per_s, c.burst), cache=ReplayCache(c.replay_cache))
        if self.pool is not None:
            try:
                s.sandbox = await s.stack.enter_async_context(self.pool.acquire())
            except SandboxError as e:
                raise ApiError(503, "sandbox_error", f"no sandbox for a new session: {e}") from e
        return s

    async def close_session(self, session_id: str) -> bool:
        return await self.session_manager.close_session(session_id)

    def session(self, session_id: str) -> Session:
        return self.session_manager.get(session_id)

    # --- calls -----------------------------------------------------------------------------
    async def call(self, session_id: str, req: CallRequest) -> tuple[ToolResult, bool]:
        """Run one call in a session; returns (result, replayed)."""
        with self.session_manager.use(session_id) as s:
            seen = s.cache.get(req.request_id)
            if seen is not None:
                self.counters["replayed"] += 1
                return await asyncio.shield(seen), True
            wait = s.bucket.take()
            if wait:
                self.counters["rate_limited"] += 1
                msg = (
                    f"Error: rate limit: this session may make {self.config.rate_per_s:g} "
                    f"tool calls per second; try again in {wait:.1f}s."
                )
                return ToolResult(
                    content=msg,
                    is_error=True,
                    metadata={"error": "rate_limited", "retry_after_s": wait},
                ), False
            return await s.cache.run(req.request_id, lambda: self._run(s, req)), False

    async def _run(self, s: Session, req: CallRequest) -> ToolResult:
        stats = self.stats.setdefault(
            req.name if req.name in self.tools else "(unknown)", ToolStats()
        )
        timeout = self.config.tool_timeouts_s.get(req.name, self.config.call_timeout_s)
        tc = ToolCall(name=req.name, arguments=req.arguments, id=req.request_id or uuid.uuid4().hex)
        injected = {"sandbox": s.sandbox} if s.sandbox is not None else {}
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                result = await self.tools.call(tc, **injected)
        except TimeoutError:
            stats.timeouts += 1
            result = ToolResult(
                content=f"Error: tool {req.name!r} timed out after {timeout:g}s.",
                is_error=True,
                metadata={"error": "timeout"},
            )
        except SandboxError as e:
            stats.errors += 1
            raise ApiError(502, "sandbox_error", str(e)) from e
        except ToolError as e:
            stats.errors += 1
            raise ApiError(500, "tool_error", str(e)) from e
        finally:
            dt = time.perf_counter() - t0
            stats.calls += 1
            stats.latency_s_sum += dt
            stats.latency_s_max = max(stats.latency_s_max, dt)
        stats.errors += int(result.is_error)
        return result

    def metrics(self) -> JSON:
        pool = self.pool.stats() if self.pool is not None else None
        return {
            "tools": {name: st.to_json() for name, st in sorted(self.stats.items())},
            "sessions_open": len(self.sessions),
            **self.counters,
            "sandboxes_live": pool.live if pool is not None else 0,
        }

    # --- HTTP ------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        """The FastAPI app; its lifespan starts and closes this server."""

        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            await self.start()
            try:
                yield
            finally:
                await self.close()

        app = FastAPI(
            title=f"agentrl tool server ({self.tools.name})", lifespan=lifespan, **NO_DOCS
        )
        install_error_handlers(app)
        app.get("/health")(lambda: {"ok": True, "tools": len(self.tools)})
        app.include_router(self._router())
        guard = HttpGuard.Config(
            token=self.config.token,
            max_body_bytes=self.config.max_body_bytes,
            cap_hint="raise ToolServer.Config.max_body_bytes",
        )
        app.add_middleware(HttpGuard, config=guard, authorize=self.session_manager.authorize)
        return app

    def _router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/tools")
        async def tools() -> list[JSON]:
            return self.tools.schemas()

        @r.post("/sessions")
        async def open_session() -> JSON:
            s = await self.open_session()
            return {"session_id": s.id, "session_token": s.token, "tools": self.tools.names}

        @r.delete("/sessions/{session_id}")
        async def close_session(session_id: str) -> JSON:
            return {"closed": await self.close_session(session_id)}

        @r.post("/sessions/{session_id}/call")
        async def call(session_id: str, req: CallRequest) -> Response:
            result, replayed = await self.call(session_id, req)
            body = {
                "content": result.content,
                "is_error": result.is_error,
                "metadata": result.metadata,
                "replayed": replayed,
            }
            return Response(json.dumps(body, default=str), media_type="application/json")

        @r.get("/metrics")
        async def metrics() -> JSON:
            return self.metrics()

        return r


def build_server(tools: ToolSet, config: ToolServer.Config) -> ToolServer:
    """A ToolServer, checking the config first."""
    if config.call_timeout_s <= 0 or any(v <= 0 for v in config.tool_timeouts_s.values()):
        raise ConfigError(
            f"timeouts must be > 0, got call_timeout_s={config.call_timeout_s}, "
            f"tool_timeouts_s={config.tool_timeouts_s}"
        )
    TokenBucket(config.rate_per_s, config.burst)  # validates the rate limit
    return ToolServer(tools, config)
