"""RemoteEnv: an ``Env`` whose episodes run on env servers (``agentrl envs serve``).

    env = make_env("remote:http://127.0.0.1:8780/games/GuessNumber-v0")
    env = make_env("remote:http://a:8780,http://b:8780/games/GuessNumber-v0",
                   remote={"token": "s3cret", "max_sessions_per_server": 64})
    env = make_env("remote:games/GuessNumber-v0")       # servers from AGENTRL_ENV_SERVERS

A RemoteEnv is an ``Env``: AgentLoops, the collector, SFT and ``agentrl envs check`` use it
unchanged. How data moves: ``make_env`` asks a server to describe the env once per
(id, kwargs) (its tools' schemas, whether it is nondeterministic; the protocol handshake
happens here) -> the first ``areset`` opens a session on the least-loaded server under its
cap (``EnvServerPool``) -> every reset, step and tool call of that env goes to that session
(sticky: one trajectory, one server) -> ``aclose`` closes the session and frees the slot.
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
Sessions are closed by ``aclose``, at interpreter exit (``atexit``), and otherwise by the
server's idle TTL.
"""

from __future__ import annotations

import asyncio
import atexit
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

import aiohttp
import gymnasium as gym
import httpx2
from gymnasium.envs.registration import EnvSpec

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.envserver.server import PROTOCOL_HEADER, PROTOCOL_VERSION
from agentrl.envserver.wire import MEDIA_TYPE, unpack
from agentrl.errors import (
    ConfigError,
    EnvError,
    EnvServerError,
    RewardError,
    SandboxError,
    ToolError,
)
from agentrl.http import SESSION_HEADER, ApiClient, api_error, bearer_headers
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


class _Api(ApiClient):
    """``ApiClient`` with one httpx2 client per live event loop (sync wrappers run a new loop
    per call; a client of a finished loop must never be reused)."""

    def __init__(self, url: str, token: str, config: RemoteConfig, retries: int) -> None:
        super().__init__(
            url,
            token,
            timeout_s=config.timeout_s,
            retries=retries,
            backoff_s=config.retry_backoff_s,
        )
        self._by_loop: weakref.WeakKeyDictionary[Any, httpx2.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx2.AsyncClient:
        loop = asyncio.get_running_loop()
        c = self._by_loop.get(loop)
        if c is None or c.is_closed:
            limits = httpx2.Limits(max_connections=1024, max_keepalive_connections=256)
            c = self._by_loop[loop] = httpx2.AsyncClient(
                base_url=self.url, headers=self.headers, timeout=self.timeout_s, limits=limits
            )
        return c


@dataclass(eq=False)
class _Server:
    url: str
    api: _Api
    once: _Api
    """One retry only (a stale keep-alive connection), then fail over: opening sessions."""
    active: int = 0
    down_until: float = 0.0


@dataclass(frozen=True, slots=True)
class RemoteSession:
    server: _Server
    id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {SESSION_HEADER: self.token, PROTOCOL_HEADER: str(PROTOCOL_VERSION)}


def _raise_for(r: httpx2.Response, where: str) -> None:
    _raise_error(r.status_code, r.content, where)


def _raise_error(status: int, body: bytes, where: str) -> None:
    """The agentrl error an env server's error answer stands for."""
    try:
        err = json.loads(body)["error"]
        kind, msg = str(err["type"]), str(err["message"])
    except Exception:
        kind, msg = "http", f"HTTP {status}: {body[:500]!r}"
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
        self.servers = [
            _Server(
                u.rstrip("/"), _Api(u, token, config, config.retries), _Api(u, token, config, 0)
            )
            for u in config.servers
        ]
        self.open_sessions: dict[str, RemoteSession] = {}
        self._described: dict[str, JSON] = {}
        self._lock = threading.Lock()
        self._hot: weakref.WeakKeyDictionary[Any, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )

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
    async def open(self, env_id: str, kwargs: JSON) -> RemoteSession:
        """A session on the least-loaded server under its cap; waits (bounded) when all are full."""
        c = self.config
        deadline = time.monotonic() + c.acquire_timeout_s
        body = {"env_id": env_id, "kwargs": kwargs, "protocol": PROTOCOL_VERSION}
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
                    r = await s.once.send("POST", "/sessions", json=body)
                except SandboxError as e:  # ApiClient's "could not reach"
                    s.active -= 1
                    s.down_until = time.monotonic() + c.down_for_s
                    errors[s.url] = str(e)
                    logger.warning("env server %s unreachable; trying another: %s", s.url, e)
                    continue
                if r.status_code == 503:  # full: try another, or wait
                    s.active -= 1
                    errors[s.url] = api_error(r)[1]
                    continue
                if r.status_code >= 400:
                    s.active -= 1
                    _raise_for(r, s.url)
                out = r.json()
                session = RemoteSession(s, str(out["session_id"]), str(out["session_token"]))
                self.open_sessions[session.id] = session
                return session
            if time.monotonic() >= deadline:
                raise EnvServerError(
                    f"no env server had a free session for {env_id} within "
                    f"acquire_timeout_s={c.acquire_timeout_s:g}: "
                    + ("; ".join(f"{u}: {m}" for u, m in errors.items()) or "all at their cap")
                )
            await asyncio.sleep(0.02)

    async def close(self, session: RemoteSession) -> None:
        if self.open_sessions.pop(session.id, None) is None:
            return
        session.server.active -= 1
        try:
            await session.server.api.send(
                "DELETE", f"/sessions/{session.id}", headers=session.headers, timeout_s=10.0
            )
        except Exception as e:  # the server's TTL closes it
            logger.info("closing env session %s failed: %s", session.id, e)

    def close_all_sync(self) -> None:
        """Close every open session (at interpreter exit; the servers' TTL is the backstop)."""
        for session in list(self.open_sessions.values()):
            self.open_sessions.pop(session.id, None)
            try:
                httpx2.delete(
                    f"{session.server.url}/sessions/{session.id}",
                    headers={**bearer_headers(self.token), **session.headers},
                    timeout=2.0,
                )
            except Exception:
                continue

    def _aiohttp(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        c = self._hot.get(loop)
        if c is None or c.closed:
            timeout = aiohttp.ClientTimeout(total=None, sock_read=self.config.timeout_s)
            c = self._hot[loop] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0),
                timeout=timeout,
                headers={**bearer_headers(self.token), "Content-Type": "application/json"},
                auto_decompress=False,
            )
        return c

    async def request(self, session: RemoteSession, what: str, body: JSON) -> Any:
        """POST ``/sessions/{id}/{what}``; the decoded frame, or the error it stands for.

        On aiohttp, not httpx2: many steps in flight at once are the common case here, and
        httpx2 spends 3-5x the CPU per request (agentrl/inference/transport.py measured it).
        A transport failure is retried with the same request id (the server's replay cache
        answers a step that already ran), then ends the episode with ``EnvServerError``."""
        data = json.dumps({**body, "request_id": uuid.uuid4().hex}).encode()
        s, c = session.server, self.config
        url = f"{s.url}/sessions/{session.id}/{what}"
        last: Exception | None = None
        for attempt in range(c.retries + 1):
            if attempt:
                await asyncio.sleep(c.retry_backoff_s * 2 ** (attempt - 1))
            try:
                async with self._aiohttp().post(url, data=data, headers=session.headers) as r:
                    status, ctype, content = r.status, r.content_type, await r.read()
                break
            except (aiohttp.ClientError, TimeoutError) as e:
                last = e
        else:
            raise EnvServerError(
                f"env server {s.url} died or stopped answering mid-episode ({what} of session "
                f"{session.id}, {c.retries + 1} tries): {type(last).__name__}: {last}"
            )
        if status >= 400:
            _raise_error(status, content, s.url)
        return unpack(content) if ctype == MEDIA_TYPE else json.loads(content)


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
        self._demonstration: list[Message] | None = None

    def __repr__(self) -> str:
        where = self.session.server.url if self.session is not None else "no session"
        return f"<RemoteEnv {self.env_id} ({where})>"

    async def _request(self, what: str, body: JSON) -> Any:
        if self.session is None:
            self.session = await self.pool.open(self.env_id, self.kwargs)
        return await self.pool.request(self.session, what, body)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        gym.Env.reset(self, seed=seed)
        out = await self._request("reset", {"seed": seed, "options": options})
        self._task_key = out.get("task_key")
        demo = out.get("demonstration")
        self._demonstration = None if demo is None else [Message.from_openai(m) for m in demo]
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

    def demonstration(self) -> list[Message] | None:
        return self._demonstration


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
