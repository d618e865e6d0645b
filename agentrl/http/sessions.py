"""Server-side sessions: one bookkeeping kernel for the tool server and the env server.

    sessions = SessionManager(SessionManager.Config(max_sessions=64, session_ttl_s=600), "tool")
    await sessions.start()                          # the reaper (idle sessions closed by TTL)
    s = await sessions.open(make)                   # make() -> a Session subclass; cap applies
    with sessions.use(s.id) as s: ...               # busy while in use (never reaped then)
    await sessions.close_session(s.id)              # its ``stack`` (sandboxes, envs) is closed
    refusal = sessions.authorize(scope)             # HttpGuard hook: the session's own token

How a session lives: ``open`` counts it against ``max_sessions`` while it is being made (a
session waiting for a sandbox holds a slot), so a burst cannot pile up past the cap. When the
server is full, ``open`` waits up to ``open_wait_s`` for a slot, then answers 503
``too_many_sessions`` (a client may try another server). Every request about a session marks
it used; a session idle longer than ``session_ttl_s`` (its client crashed or forgot it) is
closed by the reaper. Closing the manager closes every session. A session's resources go on
its ``stack`` (an ``AsyncExitStack``), which closing unwinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentrl.http.guard import SESSION_HEADER, Refusal, header, tokens_equal
from agentrl.http.service import ApiError

logger = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Session:
    """What every server session has; servers subclass it with their own state."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    """Sent by the session's client in ``X-Session-Token`` on every request about it."""
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0


S = TypeVar("S", bound=Session)


class SessionManager(Generic[S]):
    """Open, find, reap and close sessions under a cap; see the module docstring."""

    @dataclass(kw_only=True)
    class Config:
        max_sessions: int = 1024
        session_ttl_s: float = 1800.0
        """Sessions idle longer than this are closed."""
        reap_interval_s: float = 5.0
        open_wait_s: float = 0.0
        """How long a new session may wait for a free slot when the server is full (then 503)."""
        session_tokens: bool = True
        """Answer 403 to a request about a session without its token (``X-Session-Token``)."""

    def __init__(self, config: Config, kind: str = "session") -> None:
        self.config = config
        self.kind = kind
        self.sessions: dict[str, S] = {}
        self.counters = {
            "sessions_opened": 0,
            "sessions_closed": 0,
            "sessions_expired": 0,
            "sessions_refused": 0,
        }
        self._pending = 0
        self._freed: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.sessions)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def close(self) -> None:
        """Stop the reaper and close every session."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await asyncio.gather(*(self.close_session(sid) for sid in list(self.sessions)))

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            await self.reap()

    async def reap(self) -> int:
        """Close sessions idle longer than ``session_ttl_s``; returns how many."""
        now, ttl = time.monotonic(), self.config.session_ttl_s
        old = [s.id for s in self.sessions.values() if s.busy == 0 and now - s.last_used > ttl]
        for sid in old:
            logger.info("%s session %s idle for over %.0fs; closing it", self.kind, sid, ttl)
            await self.close_session(sid)
        self.counters["sessions_expired"] += len(old)
        return len(old)

    # --- sessions --------------------------------------------------------------------------
    def _full(self) -> bool:
        return len(self.sessions) + self._pending >= self.config.max_sessions

    async def open(self, make: Callable[[], Awaitable[S]]) -> S:
        """A new session from ``make()``, once a slot is free (503 if none frees in time)."""
        if self._full() and self.config.open_wait_s > 0:
            deadline = time.monotonic() + self.config.open_wait_s
            while self._full() and (left := deadline - time.monotonic()) > 0:
                if self._freed is None:
                    self._freed = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), min(left, 0.5))
        if self._full():
            self.counters["sessions_refused"] += 1
            raise ApiError(
                503,
                "too_many_sessions",
                f"{len(self.sessions)} {self.kind} sessions are open (max_sessions="
                f"{self.config.max_sessions}); close some with DELETE /sessions/{{id}}, "
                "or use another server",
            )
        self._pending += 1
        try:
            s = await make()
        finally:
            self._pending -= 1
            self._notify()
        self.sessions[s.id] = s
        self.counters["sessions_opened"] += 1
        return s

    def _notify(self) -> None:
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    async def close_session(self, session_id: str) -> bool:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return False
        try:
            await s.stack.aclose()
        except Exception:
            logger.exception("closing %s session %s failed", self.kind, session_id)
        self.counters["sessions_closed"] += 1
        self._notify()
        return True

    def get(self, session_id: str) -> S:
        s = self.sessions.get(session_id)
        if s is None:
            raise ApiError(
                404,
                "unknown_session",
                f"no {self.kind} session {session_id!r}: it was closed or idle longer than "
                f"{self.config.session_ttl_s:g}s; open a new one with POST /sessions",
            )
        return s

    @contextlib.contextmanager
    def use(self, session_id: str) -> Iterator[S]:
        """The session, marked busy (never reaped) while the block runs, then marked used."""
        s = self.get(session_id)
        s.busy += 1
        try:
            yield s
        finally:
            s.busy -= 1
            s.last_used = time.monotonic()

    # --- HttpGuard hook --------------------------------------------------------------------
    def authorize(self, scope: Any) -> Refusal | None:
        """403 for a request about a session without that session's token (before the body)."""
        parts = str(scope["path"]).split("/")  # ["", "sessions", id, ...]
        if not self.config.session_tokens or len(parts) < 3 or parts[1] != "sessions":
            return None
        s = self.sessions.get(parts[2])
        if s is None or tokens_equal(header(scope, SESSION_HEADER.lower().encode()), s.token):
            return None  # unknown sessions get the app's 404
        return Refusal(
            403,
            "wrong_session_token",
            f"session {parts[2]} was opened by another client: send the "
            f"session_token that POST /sessions returned in {SESSION_HEADER}",
        )
