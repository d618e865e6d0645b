"""RemoteEnv: an ``Env`` whose episodes run on env servers (``agentrl envs serve``).

    env = make_env("remote:http://127.0.0.1:8780/games/GuessNumber-v0")
    env = make_env("remote:http://a:8780,http://b:8780/games/GuessNumber-v0",
                   remote={"token": "s3cret", "max_sessions_per_server": 64})
    env = make_env("remote:games/GuessNumber-v0")       # servers from AGENTRL_ENV_SERVERS

A RemoteEnv is an ``Env``: AgentLoops, the collector, SFT and ``agentrl envs check`` use it
unchanged. How data moves: ``make_env`` asks a server to describe the env once per
(id, kwargs) (its tools' schemas, whether it is nondeterministic; the protocol handshake
happens here) -> the first ``areset`` opens a session on the least-loaded server under its
cap (``EnvServerPool``) and resets it, in one request -> every later reset, step and tool call
of that env goes to that session (sticky: one trajectory, one server) -> ``aclose`` closes the
session and frees the slot; the closes of all envs closed in the same event-loop turn travel
together (``POST /sessions/close``). A rollout of N steps thus costs N + 1 requests and a share
of one, over keep-alive connections (``agentrl.envserver.conn``, a lean HTTP/1.1 client).
Answers are frames (``agentrl.envserver.wire``): images arrive as raw bytes and are rebuilt
into the same data URLs the env produced.

Many servers: sessions spread over ``servers`` with at most ``max_sessions_per_server``
each. When every server is at its cap, a new session waits (up to ``acquire_timeout_s``);
a server that refuses (full, 503) or cannot be reached while a session is being opened is
skipped (failover: nothing has run there yet), and one that could not be reached is left
alone for ``down_for_s``.

Failures: a server that dies mid-episode (or loses the session) raises ``EnvServerError``
(an ``EnvError``: ``RolloutStatus.ERROR_ENV``, masked out of the loss, never reward 0);
siblings on other sessions are unaffected. An exception in the env's own code arrives as
the error kind it was (``EnvError``, ``SandboxError``, ``RewardError``, ``ToolError``).
Retried requests carry the same request id, so an env never steps twice for one call.
Sessions are closed by ``aclose``, when a RemoteEnv is garbage-collected unclosed (queued
for the next batched close), at interpreter exit (``atexit``), and otherwise by the server's
idle TTL. ``EnvServerPool.aclose()`` (or ``close_pools()``) closes the pool's connections.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import httpx2
from gymnasium.envs.registration import EnvSpec

from agentrl.env import Env, Info, Observation, StepResult, run_sync
from agentrl.envserver.api import PROTOCOL_HEADER, PROTOCOL_VERSION
from agentrl.envserver.conn import ConnPool, TransportError
from agentrl.envserver.wire import MEDIA_TYPE, unpack
from agentrl.errors import (
    ConfigError,
    EnvError,
    EnvServerError,
    RewardError,
    SandboxError,
    ToolError,
)
from agentrl.http import SESSION_HEADER, bearer_headers
from agentrl.tool import ToolResult, ToolSet
from agentrl.toolserver.client import SchemaTool
from agentrl.types import JSON, Message, ToolCall

logger = logging.getLogger(__name__)

SERVERS_ENV = "AGENTRL_ENV_SERVERS"
"""Comma-separated env server URLs for ``remote:ID`` without servers in it."""
TOKEN_ENV = "AGENTRL_ENV_TOKEN"
"""The env servers' bearer token (server and client)."""
PREFIX = "remote:"
_SPEC = re.compile(r"^(?:(?P<servers>.+)/)?(?P<id>[\w.-]+/[\w.-]+-v\d+)$")


@dataclass(kw_only=True)
class RemoteConfig:
    """Where remote envs run; ``make_env(..., remote={...})`` sets any of these."""

    servers: list[str] = field(default_factory=list)
    token: str = ""
    """Bearer token ("" = the AGENTRL_ENV_TOKEN environment variable, if set)."""
    max_sessions_per_server: int = 64
    acquire_timeout_s: float = 60.0
    """How long a new session may wait for a slot on some server."""
    timeout_s: float = 330.0
    """HTTP timeout per request; keep it above the servers' step_timeout_s."""
    retries: int = 2
    retry_backoff_s: float = 0.2
    down_for_s: float = 5.0
    """A server that could not be reached gets no new session for this long."""


@dataclass(eq=False)
class _Server:
    url: str
    conn: ConnPool
    active: int = 0
    down_until: float = 0.0
    closing: list[RemoteSession] = field(default_factory=list)
    """Sessions to close in the next batch (``POST /sessions/close``)."""
    flush: asyncio.Future[None] | None = None


@dataclass(frozen=True, slots=True)
class RemoteSession:
    server: _Server
    id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {SESSION_HEADER: self.token, PROTOCOL_HEADER: str(PROTOCOL_VERSION)}

    @property
    def head(self) -> str:
        """The headers as HTTP header lines (``ConnPool.post``)."""
        return f"{SESSION_HEADER}: {self.token}\r\n{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n"


def _raise_for(r: httpx2.Response, where: str) -> None:
    _raise_error(r.status_code, r.content, where)


_FRAME = MEDIA_TYPE.encode()


def _error(status: int, body: bytes) -> tuple[str, str]:
    try:
        err = json.loads(body)["error"]
        return str(err["type"]), str(err["message"])
    except Exception:
        return "http", f"HTTP {status}: {body[:500]!r}"


def _error_text(status: int, body: bytes) -> str:
    return _error(status, body)[1]


def _raise_error(status: int, body: bytes, where: str) -> None:
    """The agentrl error an env server's error answer stands for."""
    kind, msg = _error(status, body)
    text = f"env server {where}: {msg}"
    if status in (401, 403):
        raise EnvServerError(f"{text} (pass remote={{'token': ...}} or set {TOKEN_ENV})")
    if kind == "unknown_session":
        raise EnvServerError(f"{text} (the server restarted or reaped the session)")
    cls: type[Exception] = {
        "sandbox_error": SandboxError,
        "reward_error": RewardError,
        "tool_error": ToolError,
        "env_error": EnvError,
        "bad_env": ConfigError,
        "unknown_env": ConfigError,
        "protocol_mismatch": ConfigError,
        "bad_request": ConfigError,
    }.get(kind, EnvServerError)
    raise cls(text)


class EnvServerPool:
    """Sessions over several env servers, each under a cap; see the module docstring."""

    def __init__(self, config: RemoteConfig) -> None:
        if not config.servers:
            raise ConfigError(
                f"remote envs need servers: write remote:URL[,URL...]/ID or set {SERVERS_ENV}"
            )
        if config.max_sessions_per_server < 1:
            raise ConfigError(
                f"max_sessions_per_server must be >= 1, got {config.max_sessions_per_server}"
            )
        self.config = config
        token = config.token or os.environ.get(TOKEN_ENV, "")
        self.token = token
        try:
            self.servers = [
                _Server(
                    u.rstrip("/"),
                    ConnPool(u, bearer_headers(token), timeout_s=config.timeout_s),
                )
                for u in config.servers
            ]
        except ValueError as e:
            raise ConfigError(str(e)) from e
        self.open_sessions: dict[str, RemoteSession] = {}
        self._described: dict[str, JSON] = {}
        self._lock = threading.Lock()

    # --- describe (sync: make_env is sync) --------------------------------------------------
    def describe(self, env_id: str, kwargs: JSON) -> JSON:
        key = json.dumps([env_id, kwargs], sort_keys=True, default=str)
        with self._lock:
            if key in self._described:
                return self._described[key]
        errors = []
        for s in self.servers:
            try:
                with httpx2.Client(
                    base_url=s.url, headers=bearer_headers(self.token), timeout=30.0
                ) as c:
                    r = c.get("/protocol")
                    if r.status_code >= 400:
                        _raise_for(r, s.url)
                    theirs = r.json().get("protocol")
                    if theirs != PROTOCOL_VERSION:
                        raise ConfigError(
                            f"env server {s.url} speaks env protocol {theirs}, this client "
                            f"{PROTOCOL_VERSION}; run the same agentrl version on both sides"
                        )
                    r = c.post("/describe", json={"env_id": env_id, "kwargs": kwargs})
                    if r.status_code >= 400:
                        _raise_for(r, s.url)
                    out: JSON = r.json()
            except httpx2.TransportError as e:
                errors.append(f"{s.url}: {type(e).__name__}: {e}")
                continue
            with self._lock:
                self._described[key] = out
            return out
        raise EnvServerError(f"no env server answered to describe {env_id}: {'; '.join(errors)}")

    # --- sessions ---------------------------------------------------------------------------
    async def open(
        self, env_id: str, kwargs: JSON, reset: JSON | None = None
    ) -> tuple[RemoteSession, Any]:
        """A session on the least-loaded server under its cap (waits, bounded, when all are
        full), and the answer of ``reset`` (a reset request's body) run in it, if given."""
        c = self.config
        deadline = time.monotonic() + c.acquire_timeout_s
        req: JSON = {"env_id": env_id, "kwargs": kwargs, "protocol": PROTOCOL_VERSION}
        if reset is not None:
            req["reset"] = reset
            req["request_id"] = uuid.uuid4().hex  # a retried open gets the first answer
        data = json.dumps(req).encode()
        errors: dict[str, str] = {}
        while True:
            now = time.monotonic()
            up = [s for s in self.servers if s.down_until <= now]
            if not up:
                raise EnvServerError(
                    f"no env server can be reached for {env_id}: "
                    + "; ".join(f"{u}: {m}" for u, m in errors.items())
                )
            for s in sorted(up, key=lambda s: s.active):
                if s.active >= c.max_sessions_per_server:
                    continue
                s.active += 1
                try:
                    status, ctype, content = await self._post(s, "/sessions", data, "", tries=2)
                except TransportError as e:
                    s.active -= 1
                    s.down_until = time.monotonic() + c.down_for_s
                    errors[s.url] = str(e)
                    logger.warning("env server %s unreachable; trying another: %s", s.url, e)
                    continue
                if status == 503:  # full: try another, or wait
                    s.active -= 1
                    errors[s.url] = _error_text(status, content)
                    continue
                if status >= 400:
                    s.active -= 1
                    _raise_error(status, content, s.url)
                out = unpack(content) if ctype == _FRAME else json.loads(content)
                session = RemoteSession(s, str(out["session_id"]), str(out["session_token"]))
                self.open_sessions[session.id] = session
                return session, out.get("reset")
            if time.monotonic() >= deadline:
                raise EnvServerError(
                    f"no env server had a free session for {env_id} within "
                    f"acquire_timeout_s={c.acquire_timeout_s:g}: "
                    + ("; ".join(f"{u}: {m}" for u, m in errors.items()) or "all at their cap")
                )
            await asyncio.sleep(0.02)

    async def _post(
        self, s: _Server, path: str, data: bytes, head: str, *, tries: int
    ) -> tuple[int, bytes, bytes]:
        """``ConnPool.post``, a transport failure retried with backoff (``tries`` in all)."""
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
            try:
                return await s.conn.post(path, data, head)
            except TransportError:
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def forget(self, session: RemoteSession) -> bool:
        """Take ``session`` off the open ones and queue it for the server's next batched close."""
        if self.open_sessions.pop(session.id, None) is None:
            return False
        session.server.active -= 1
        session.server.closing.append(session)
        return True

    async def close(self, session: RemoteSession) -> None:
        """Close ``session`` (its server's slot frees at once); the closes of every session
        closed in the same event-loop turn go to the server in one request, awaited here."""
        if not self.forget(session):
            return
        await self._flush_soon(session.server)

    def _flush_soon(self, s: _Server) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if s.flush is None or s.flush.done() or s.flush.get_loop() is not loop:
            s.flush = loop.create_task(self._flush(s))
        return asyncio.shield(s.flush)

    async def _flush(self, s: _Server) -> None:
        await asyncio.sleep(0)  # the closes of this turn join the batch
        batch, s.closing = s.closing, []
        if s.flush is asyncio.current_task():
            s.flush = None
        if not batch:
            return
        refs = [{"id": x.id, "token": x.token} for x in batch]
        data = json.dumps({"sessions": refs}).encode()
        try:
            status, _, content = await self._post(s, "/sessions/close", data, "", tries=2)
            if status >= 400:
                logger.info("closing %d env sessions on %s: %s", len(batch), s.url, content[:200])
        except Exception as e:  # the server's TTL closes them
            logger.info("closing %d env sessions on %s failed: %s", len(batch), s.url, e)

    def close_all_sync(self) -> None:
        """Close every open session (at interpreter exit; the servers' TTL is the backstop)."""
        by_server: dict[int, tuple[_Server, list[RemoteSession]]] = {}
        for session in list(self.open_sessions.values()):
            self.forget(session)
        for s in self.servers:
            batch, s.closing = s.closing, []
            if batch:
                by_server[id(s)] = (s, batch)
        for s, batch in by_server.values():
            try:
                httpx2.post(
                    f"{s.url}/sessions/close",
                    json={"sessions": [{"id": x.id, "token": x.token} for x in batch]},
                    headers=bearer_headers(self.token),
                    timeout=2.0,
                )
            except Exception:
                continue

    async def aclose(self) -> None:
        """Close the sessions queued for closing, then this event loop's connections."""
        loop = asyncio.get_running_loop()
        flushes = [self._flush_soon(s) for s in self.servers if s.closing]
        pending = [
            s.flush
            for s in self.servers
            if s.flush is not None and not s.flush.done() and s.flush.get_loop() is loop
        ]
        await asyncio.gather(*flushes, *pending, return_exceptions=True)
        for s in self.servers:
            await s.conn.aclose()

    async def request(self, session: RemoteSession, what: str, body: JSON) -> Any:
        """POST ``/sessions/{id}/{what}``; the decoded frame, or the error it stands for.

        On ``ConnPool`` (a lean keep-alive HTTP/1.1 client): many steps in flight at once
        are the common case here, and aiohttp spends about ten times its CPU per request.
        A transport failure is retried with the same request id (the server's replay cache
        answers a step that already ran), then ends the episode with ``EnvServerError``."""
        data = json.dumps({**body, "request_id": uuid.uuid4().hex}).encode()
        s, c = session.server, self.config
        try:
            status, ctype, content = await self._post(
                s, f"/sessions/{session.id}/{what}", data, session.head, tries=c.retries + 1
            )
        except TransportError as e:
            raise EnvServerError(
                f"env server {s.url} died or stopped answering mid-episode ({what} of session "
                f"{session.id}, {c.retries + 1} tries): {e}"
            ) from e
        if status >= 400:
            _raise_error(status, content, s.url)
        return unpack(content) if ctype == _FRAME else json.loads(content)


_POOLS: dict[str, EnvServerPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(config: RemoteConfig) -> EnvServerPool:
    """The process's pool for these servers and caps (all remote envs share its caps)."""
    key = json.dumps(vars(config), sort_keys=True)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            if not _POOLS:
                atexit.register(_close_all)
            pool = _POOLS[key] = EnvServerPool(config)
        return pool


def _close_all() -> None:
    for pool in list(_POOLS.values()):
        pool.close_all_sync()


async def close_pools() -> None:
    """``aclose`` every pool of this process (their connections on this event loop)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        await pool.aclose()


class RemoteEnvTools(ToolSet):
    """The env's tools, run by the env server in the env's session (``tools/call``)."""

    def __init__(self, env: RemoteEnv, schemas: list[JSON]) -> None:
        super().__init__(name=f"remote:{env.env_id}")
        self._env = weakref.ref(env)
        for schema in schemas:
            self.add(SchemaTool(schema, self._run))

    async def _run(self, tool_call: ToolCall) -> ToolResult:
        return await self.call(tool_call)

    async def call(self, tool_call: ToolCall, **injected: Any) -> ToolResult:
        env = self._env()
        if env is None:
            raise EnvServerError("the remote env of these tools was closed")
        body = {"name": tool_call.name, "arguments": tool_call.arguments, "id": tool_call.id}
        out = await env._request("tools/call", body)
        meta = out.get("metadata") or {}
        return ToolResult(
            content=str(out["content"]),
            is_error=bool(out["is_error"]),
            metadata=meta if isinstance(meta, dict) else {"value": meta},
        )


class RemoteEnv(Env):
    """An env served by an env server; built by ``make_env("remote:...")``."""

    def __init__(self, env_id: str, kwargs: JSON, pool: EnvServerPool, described: JSON) -> None:
        self.env_id = env_id
        self.kwargs = dict(kwargs)
        self.pool = pool
        self.nondeterministic = bool(described.get("nondeterministic"))
        schemas = list(described.get("tools") or [])
        self.tools = RemoteEnvTools(self, schemas) if schemas else None
        self.session: RemoteSession | None = None
        self._task_key: str | None = None
        self._demonstration: list[Message] | None = None  # this episode's, once fetched
        self._demonstration_fetched = False

    def __repr__(self) -> str:
        where = self.session.server.url if self.session is not None else "no session"
        return f"<RemoteEnv {self.env_id} ({where})>"

    async def _request(self, what: str, body: JSON) -> Any:
        if self.session is None:
            if what == "reset":  # open and reset in one request
                self.session, out = await self.pool.open(self.env_id, self.kwargs, body)
                return out
            self.session, _ = await self.pool.open(self.env_id, self.kwargs)
        return await self.pool.request(self.session, what, body)

    def __del__(self) -> None:
        # dropped unclosed: the session goes with the server's next batched close (or the
        # atexit close), not only after its TTL
        session = getattr(self, "session", None)
        if session is not None:
            self.session = None
            with contextlib.suppress(Exception):
                if self.pool.forget(session):
                    self.pool._flush_soon(session.server)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        gym.Env.reset(self, seed=seed)
        out = await self._request("reset", {"seed": seed, "options": options})
        self._task_key = out.get("task_key")
        self._demonstration, self._demonstration_fetched = None, False
        return [Message.from_openai(m) for m in out["observation"]], dict(out.get("info") or {})

    async def astep(self, action: Message) -> StepResult:
        out = await self._request("step", {"action": Message.coerce(action).to_openai()})
        return (
            [Message.from_openai(m) for m in out["observation"]],
            float(out["reward"]),
            bool(out["terminated"]),
            bool(out["truncated"]),
            dict(out.get("info") or {}),
        )

    async def aclose(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await self.pool.close(session)

    def task_key(self, observation: Observation, info: Info) -> str:
        return self._task_key if self._task_key is not None else super().task_key(observation, info)

    async def ademonstration(self) -> list[Message] | None:
        """The served env's ``ademonstration()`` for this episode, fetched once per reset."""
        if self.session is None:
            return None  # not reset yet: no episode to demonstrate
        if not self._demonstration_fetched:
            demo = (await self._request("demonstration", {}))["demonstration"]
            self._demonstration = None if demo is None else [Message.from_openai(m) for m in demo]
            self._demonstration_fetched = True
        return self._demonstration

    def demonstration(self) -> list[Message] | None:
        """``ademonstration()`` from sync code (``envs check``); inside an event loop, await
        ``ademonstration()`` instead."""
        if self._demonstration_fetched:
            return self._demonstration
        return run_sync(self.ademonstration())


def make_remote_env(spec: str, **kwargs: Any) -> RemoteEnv:
    """``make_env("remote:...")``: ``spec`` is ``[URL[,URL...]/]ns/Name-vN``; ``remote=`` (a dict
    of ``RemoteConfig`` fields) sets the token and caps; the other kwargs go to the env."""
    m = _SPEC.match(spec)
    if m is None:
        raise ConfigError(
            f"remote env {PREFIX}{spec!r} is malformed: write remote:URL[,URL...]/ns/Name-vN "
            f"(e.g. remote:http://127.0.0.1:8780/games/GuessNumber-v0) or remote:ns/Name-vN "
            f"with {SERVERS_ENV} set"
        )
    remote = kwargs.pop("remote", None) or {}
    if not isinstance(remote, dict):
        raise ConfigError(f"remote= must be a dict of RemoteConfig fields, got {remote!r}")
    servers = m["servers"] or os.environ.get(SERVERS_ENV, "")
    try:
        config = RemoteConfig(**{"servers": [u for u in servers.split(",") if u], **remote})
    except TypeError as e:
        raise ConfigError(f"remote=: {e}; fields: {', '.join(RemoteConfig.__annotations__)}") from e
    pool = pool_for(config)
    env_id = m["id"]
    described = pool.describe(env_id, kwargs)
    env = RemoteEnv(env_id, kwargs, pool, described)
    env.spec = EnvSpec(
        id=env_id,
        entry_point=f"{PREFIX}{','.join(config.servers)}",
        nondeterministic=env.nondeterministic,
        max_episode_steps=described.get("max_episode_steps"),
        kwargs=dict(kwargs),
    )
    return env
