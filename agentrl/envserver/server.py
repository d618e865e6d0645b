"""The env server: registered envs over HTTP, one env per session, its tools beside it.

    server = EnvServer(EnvServer.Config(env_ids=["games/GuessNumber-v0"], token="s3cret"))
    uvicorn.run(server.app(), host="127.0.0.1", port=8780, loop=SERVER_LOOP)
    # or: agentrl envs serve games/GuessNumber-v0 --port 8780 --token "$T"

    GET    /health (no auth)             {"ok", "envs", "protocol"}
    GET    /protocol                     {"protocol": 2, "server": "agentrl-env"}  (handshake)
    GET    /envs                         the env ids served, with descriptions
    POST   /describe    {env_id, kwargs} {tools, nondeterministic, max_episode_steps}
    POST   /sessions    {env_id, kwargs, protocol} -> {session_id, session_token, tools, ...}
    POST   /sessions    {..., reset: {seed, options}, request_id}
                        -> frame {session_id, session_token, reset: <the reset answer>}
    GET    /sessions                     the open sessions (id, env id, steps, idle seconds)
    POST   /sessions/{id}/reset  {seed, options, request_id}        -> frame
    POST   /sessions/{id}/step   {action, request_id}               -> frame
    POST   /sessions/{id}/demonstration {request_id}   -> frame {demonstration} (the env's
                                  ``ademonstration()`` for the current episode, on request)
    POST   /sessions/{id}/tools/call {name, arguments, id, request_id} -> frame (a ToolResult)
    DELETE /sessions/{id}                closes the session and its env
    POST   /sessions/close {sessions: [{id, token}, ...]} -> {closed}  (many at once)
    GET    /metrics                      Prometheus text format

How a step moves: ``HttpGuard`` (bearer token, the session's ``X-Session-Token``, the body
cap, all before the body is read) -> ``SessionManager`` (404 for an unknown or expired
session; the session is busy, so never reaped, while it runs) -> the session's replay cache
(a retried ``request_id`` gets its first answer; an env never steps twice for one request)
-> the per-session caps (a token-bucket rate, ``max_steps`` per session) -> ``env.astep``
under ``step_timeout_s`` -> the answer as a frame (``agentrl.envserver.wire``: JSON with
images as raw bytes). Tool calls of an AgentLoop that runs the env's tools itself arrive on
``tools/call`` and run on ``env.tools`` here, with ``env`` injected, as they would locally.

The hot routes (open, reset, step, tool calls, batched close) are served by ``HotRoutes`` (``agentrl.envserver.asgi``), a
raw ASGI app inside ``HttpGuard`` (so auth, session tokens and body caps are checked first, as
for every route) and in front of FastAPI, whose per-request machinery (routing, dependency
solving, exception middleware) cost more CPU than a step of most envs. A client opens a
session and resets it in one request (``reset`` in the open body; a retried open with the
same ``request_id`` gets the first answer, so a retry never leaks a session), and closes the
sessions of many finished rollouts in one ``POST /sessions/close``: a rollout of N steps is
N + 1 requests and a share of one.

Failures: an exception from env code is 500 ``env_error`` (the client raises ``EnvError``,
as the env would locally); ``SandboxError``/``RewardError``/``ToolError`` keep their kind
(``sandbox_error``, ``reward_error``, ``tool_error``), so a rollout ends with the status it
would have locally. A full server answers 503 ``too_many_sessions`` after waiting up to
``open_wait_s`` for a slot; the client then tries another server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Request, Response

from agentrl.env import Env, make_env
from agentrl.envserver.api import (
    PROTOCOL_VERSION,
    CloseRequest,
    OpenRequest,
    ResetRequest,
    StepRequest,
    ToolCallRequest,
)
from agentrl.envserver.asgi import HotRoutes
from agentrl.envserver.wire import pack
from agentrl.errors import (
    AgentRLError,
    ConfigError,
    RewardError,
    SandboxError,
    ToolError,
)
from agentrl.http import (
    NO_DOCS,
    ApiError,
    HttpGuard,
    ReplayCache,
    TokenBucket,
    install_error_handlers,
    json_response,
    parse_body,
    tokens_equal,
)
from agentrl.http.sessions import Session, SessionManager
from agentrl.types import JSON, Message, ToolCall

if TYPE_CHECKING:
    from starlette.types import ASGIApp

logger = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class EnvSession(Session):
    """One client's env (one trajectory at a time), its caps and its replay cache."""

    env_id: str
    env: Env
    bucket: TokenBucket
    cache: ReplayCache[bytes]
    steps: int = 0
    opened: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _EnvStats:
    sessions: int = 0
    resets: int = 0
    steps: int = 0
    tool_calls: int = 0
    errors: int = 0
    step_s_sum: float = 0.0


def _jsonable(v: Any) -> Any:
    """What ``json`` cannot write: numpy scalars/arrays by value, anything else as text."""
    item = getattr(v, "tolist", None)
    return item() if callable(item) else str(v)


def _error_kind(e: BaseException) -> str:
    for cls, kind in (
        (SandboxError, "sandbox_error"),
        (RewardError, "reward_error"),
        (ToolError, "tool_error"),
    ):
        if isinstance(e, cls):
            return kind
    return "env_error"


class EnvServer:
    """Serve registered envs over HTTP; see the module docstring."""

    @dataclass(kw_only=True)
    class Config:
        env_ids: list[str] = field(default_factory=list)
        """The env ids clients may open; [] = every registered env."""
        token: str = ""
        """Bearer token required on every route but /health ("" = none; loopback only)."""
        max_sessions: int = 256
        """Envs alive at once; more wait up to open_wait_s, then get 503."""
        open_wait_s: float = 2.0
        session_ttl_s: float = 600.0
        """Sessions idle longer than this (a crashed client's) are closed with their env."""
        reap_interval_s: float = 5.0
        step_timeout_s: float = 300.0
        """Longest a reset, step or tool call may run; then the client reads env_error."""
        max_steps: int = 100_000
        """Resets + steps + tool calls one session may make (a per-session resource cap)."""
        rate_per_s: float = 1000.0
        """Requests per second a session may make, on average (token bucket)."""
        burst: int = 1000
        max_body_bytes: int = 4 << 20
        """Largest request body (an action, env kwargs); larger ones get 413 unread."""
        session_tokens: bool = True
        replay_cache: int = 8

    def __init__(self, config: Config | None = None) -> None:
        self.config = c = config or EnvServer.Config()
        if c.step_timeout_s <= 0 or c.max_steps < 1:
            raise ConfigError(
                f"step_timeout_s must be > 0 and max_steps >= 1, got {c.step_timeout_s} and "
                f"{c.max_steps}"
            )
        TokenBucket(c.rate_per_s, c.burst)  # validates the rate limit
        self.sessions: SessionManager[EnvSession] = SessionManager(
            SessionManager.Config(
                max_sessions=c.max_sessions,
                session_ttl_s=c.session_ttl_s,
                reap_interval_s=c.reap_interval_s,
                open_wait_s=c.open_wait_s,
                session_tokens=c.session_tokens,
            ),
            kind="env",
        )
        self.stats: defaultdict[str, _EnvStats] = defaultdict(_EnvStats)
        self._described: dict[str, JSON] = {}
        self._opens: ReplayCache[bytes] = ReplayCache(1024)

    # --- envs ------------------------------------------------------------------------------
    def served(self) -> list[str]:
        if self.config.env_ids:
            return list(self.config.env_ids)
        from agentrl.env import ENVS

        return sorted(s.id for s in ENVS)

    def _check_id(self, env_id: str) -> None:
        if self.config.env_ids and env_id not in self.config.env_ids:
            raise ApiError(
                404,
                "unknown_env",
                f"this server does not serve {env_id!r}; it serves "
                f"{', '.join(self.config.env_ids)} (agentrl envs serve ID...)",
            )

    def _make(self, env_id: str, kwargs: JSON) -> Env:
        self._check_id(env_id)
        try:
            return make_env(env_id, **kwargs)
        except AgentRLError as e:
            raise ApiError(400, "bad_env", f"{type(e).__name__}: {e}") from e
        except Exception as e:
            raise ApiError(500, "env_error", f"making {env_id}: {type(e).__name__}: {e}") from e

    @staticmethod
    def _describe(env: Env) -> JSON:
        spec = env.spec
        return {
            "tools": env.tools.schemas() if env.tools is not None else [],
            "nondeterministic": bool(env.nondeterministic),
            "max_episode_steps": spec.max_episode_steps if spec is not None else None,
            "protocol": PROTOCOL_VERSION,
        }

    async def describe(self, env_id: str, kwargs: JSON) -> JSON:
        key = json.dumps([env_id, kwargs], sort_keys=True, default=str)
        if key not in self._described:
            env = self._make(env_id, kwargs)
            try:
                self._described[key] = self._describe(env)
            finally:
                await env.aclose()
        return self._described[key]

    # --- sessions --------------------------------------------------------------------------
    async def open_session(self, req: OpenRequest) -> EnvSession:
        if req.protocol != PROTOCOL_VERSION:
            raise ApiError(
                400,
                "protocol_mismatch",
                f"client speaks env protocol {req.protocol}, this server {PROTOCOL_VERSION}; "
                "run the same agentrl version on both sides",
            )
        self._check_id(req.env_id)

        async def make() -> EnvSession:
            env = self._make(req.env_id, req.kwargs)
            s = EnvSession(
                env_id=req.env_id,
                env=env,
                bucket=TokenBucket(self.config.rate_per_s, self.config.burst),
                cache=ReplayCache(self.config.replay_cache),
            )
            s.stack.push_async_callback(env.aclose)
            return s

        s = await self.sessions.open(make)
        self.stats[req.env_id].sessions += 1
        return s

    async def _run(
        self,
        session_id: str,
        request_id: str,
        what: str,
        fn: Callable[[EnvSession], Awaitable[JSON]],
        wrap: Callable[[EnvSession, Any], Any] | None = None,
    ) -> bytes:
        """The frame answering ``what`` on the session (replayed for a seen ``request_id``);
        ``wrap(session, answer)`` is what the frame carries, if given."""
        with self.sessions.use(session_id) as s:
            seen = s.cache.get(request_id)
            if seen is not None:
                body = await asyncio.shield(seen)
            else:
                if s.steps >= self.config.max_steps:
                    raise ApiError(
                        429,
                        "session_cap",
                        f"session {s.id} made max_steps={self.config.max_steps} requests; "
                        "open a new session",
                    )
                if s.bucket.take():
                    raise ApiError(
                        429,
                        "rate_limited",
                        f"session {s.id} is over rate_per_s={self.config.rate_per_s:g}",
                    )
                s.steps += 1
                body = await s.cache.run(request_id, lambda: self._guarded(s, what, fn, wrap))
        return body

    async def open_and_reset(self, req: OpenRequest) -> bytes:
        """``POST /sessions`` with ``reset``: a new session, reset; both in one frame.

        A reset that fails closes the session again (the client has no id to close it with)."""
        assert req.reset is not None
        reset = req.reset

        async def run() -> bytes:
            s = await self.open_session(req)
            try:
                return await self._run(
                    s.id,
                    "",
                    "reset",
                    lambda s: self._reset(s, reset),
                    lambda s, out: {"session_id": s.id, "session_token": s.token, "reset": out},
                )
            except BaseException:
                await self.sessions.close_session(s.id)
                raise

        seen = self._opens.get(req.request_id)
        if seen is not None:
            return await asyncio.shield(seen)
        return await self._opens.run(req.request_id, run)

    async def close_many(self, req: CloseRequest) -> JSON:
        """``POST /sessions/close``: each session whose token matches is closed."""
        closed = refused = 0
        for ref in req.sessions:
            s = self.sessions.sessions.get(ref.id)
            if s is None:
                continue
            if self.sessions.config.session_tokens and not tokens_equal(ref.token, s.token):
                refused += 1
                continue
            closed += int(await self.sessions.close_session(ref.id))
        return {"closed": closed, "wrong_token": refused}

    async def _guarded(
        self,
        s: EnvSession,
        what: str,
        fn: Callable[[EnvSession], Awaitable[JSON]],
        wrap: Callable[[EnvSession, Any], Any] | None = None,
    ) -> bytes:
        st = self.stats[s.env_id]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.step_timeout_s):
                out = await fn(s)
        except TimeoutError as e:
            st.errors += 1
            raise ApiError(
                500, "env_error", f"{what} took over step_timeout_s={self.config.step_timeout_s:g}"
            ) from e
        except ApiError:
            raise
        except Exception as e:
            st.errors += 1
            logger.info("%s of %s raised %s: %s", what, s.env_id, type(e).__name__, e)
            raise ApiError(500, _error_kind(e), f"{what}: {type(e).__name__}: {e}") from e
        finally:
            st.step_s_sum += time.perf_counter() - t0
        return pack(out if wrap is None else wrap(s, out), default=_jsonable)

    async def _reset(self, s: EnvSession, req: ResetRequest) -> JSON:
        self.stats[s.env_id].resets += 1
        obs, info = await s.env.areset(seed=req.seed, options=req.options)
        return {
            "observation": [Message.coerce(m).to_openai() for m in obs],
            "info": info,
            "task_key": s.env.task_key(obs, info),
        }

    async def _demonstration(self, s: EnvSession) -> JSON:
        """The oracle for the current episode, only when asked: most resets never need it,
        and some oracles (SWE) act in the env's sandbox to record what it shows."""
        demo = await s.env.ademonstration()
        return {"demonstration": None if demo is None else [m.to_openai() for m in demo]}

    async def _step(self, s: EnvSession, req: StepRequest) -> JSON:
        self.stats[s.env_id].steps += 1
        action = Message.from_openai(req.action)
        obs, reward, terminated, truncated, info = await s.env.astep(action)
        return {
            "observation": [Message.coerce(m).to_openai() for m in obs],
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "info": info,
        }

    async def _tool_call(self, s: EnvSession, req: ToolCallRequest) -> JSON:
        self.stats[s.env_id].tool_calls += 1
        if s.env.tools is None:
            raise ToolError(f"{s.env_id} has no tools; {req.name!r} was not run")
        tc = ToolCall(name=req.name, arguments=req.arguments, id=req.id or uuid.uuid4().hex)
        r = await s.env.tools.call(tc, env=s.env)
        return {"content": r.content, "is_error": r.is_error, "metadata": r.metadata}

    # --- metrics ---------------------------------------------------------------------------
    def metrics_text(self) -> str:
        """The server's counters in the Prometheus text exposition format (0.0.4)."""
        c = self.sessions.counters
        lines = [
            "# TYPE agentrl_env_sessions_open gauge",
            f"agentrl_env_sessions_open {len(self.sessions)}",
        ]
        for name in ("opened", "closed", "expired", "refused"):
            lines += [
                f"# TYPE agentrl_env_sessions_{name}_total counter",
                f"agentrl_env_sessions_{name}_total {c[f'sessions_{name}']}",
            ]
        per_env = (
            ("resets_total", "counter", "resets"),
            ("steps_total", "counter", "steps"),
            ("tool_calls_total", "counter", "tool_calls"),
            ("errors_total", "counter", "errors"),
            ("busy_seconds_total", "counter", "step_s_sum"),
        )
        for metric, kind, attr in per_env:
            lines.append(f"# TYPE agentrl_env_{metric} {kind}")
            for env_id, st in sorted(self.stats.items()):
                lines.append(f'agentrl_env_{metric}{{env="{env_id}"}} {getattr(st, attr)}')
        return "\n".join(lines) + "\n"

    # --- HTTP ------------------------------------------------------------------------------
    def app(self) -> ASGIApp:
        """The ASGI app: ``HttpGuard`` -> the hot routes (``HotRoutes`` (``agentrl.envserver.asgi``)) -> FastAPI, whose
        lifespan starts the reaper and closes every session."""

        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            await self.sessions.start()
            try:
                yield
            finally:
                await self.sessions.close()

        app = FastAPI(title="agentrl env server", lifespan=lifespan, **NO_DOCS)
        install_error_handlers(app)
        app.get("/health")(
            lambda: {"ok": True, "envs": self.served(), "protocol": PROTOCOL_VERSION}
        )
        app.include_router(self._router())
        guard = HttpGuard.Config(
            token=self.config.token,
            max_body_bytes=self.config.max_body_bytes,
            cap_hint="raise EnvServer.Config.max_body_bytes (--max-body-mb)",
        )
        # the guard outermost, then the hot routes: no Starlette middleware on the hot path
        return HttpGuard(HotRoutes(app, self), config=guard, authorize=self.sessions.authorize)

    def _router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/protocol")
        async def protocol() -> JSON:
            return {"protocol": PROTOCOL_VERSION, "server": "agentrl-env"}

        @r.get("/envs")
        async def envs() -> list[str]:
            return self.served()

        @r.post("/describe")
        async def describe(request: Request) -> Response:
            req = parse_body(OpenRequest, await request.body())
            return json_response(await self.describe(req.env_id, req.kwargs))

        @r.get("/sessions")
        async def list_sessions() -> JSON:
            now = time.monotonic()
            return {
                "sessions": [
                    {"id": s.id, "env_id": s.env_id, "steps": s.steps, "idle_s": now - s.last_used}
                    for s in self.sessions.sessions.values()
                ],
                "max_sessions": self.config.max_sessions,
            }

        @r.delete("/sessions/{session_id}")
        async def close_session(session_id: str) -> JSON:
            return {"closed": await self.sessions.close_session(session_id)}

        @r.get("/metrics")
        async def metrics() -> Response:
            return Response(self.metrics_text(), media_type="text/plain; version=0.0.4")

        return r

    @staticmethod
    def _parse(model: type[Any], body: bytes) -> Any:
        try:
            return parse_body(model, body)
        except ConfigError as e:
            raise ApiError(422, "bad_request", str(e)) from e
