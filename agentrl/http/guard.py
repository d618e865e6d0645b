"""One HTTP guard for every agentrl server: auth before the body is read, and a body cap.

    app = FastAPI(...)
    app.add_middleware(HttpGuard, config=HttpGuard.Config(token=t), authorize=session_check)

    request -> a public path (/health)?                          -> the app, no checks
            -> Authorization: Bearer <token> (constant-time)      -> 401, body never read
            -> authorize(scope) (e.g. per-session tokens)         -> 403, body never read
            -> Content-Length over the route's cap                -> 413, body never read
            -> the app; a body without a Content-Length (chunked) -> 413 once past the cap
               is counted as the app receives it (HTTP framing ends the others at their length)

Why a pure ASGI middleware and not a FastAPI dependency: FastAPI reads and parses a route's
body before it runs the route's dependencies, so a bearer check written as one let anyone who
could reach a server make it buffer and parse a body of any size first (one unauthenticated
256 MB JSON body grew the tool server from 57 to 820 MB of RSS before its 401). The guard
answers before the app asks for a single body byte; uvicorn then discards the rest of the body
as it arrives (never buffered) and keeps the connection. Closing instead would be cheaper for
the server, but a client still writing its body then reads a connection reset, not the 401
or 413 (httpx2 lost the answer that way), the reason web servers "linger" before closing.
Refusals are JSON: ``{"error": {"type", "message", "code"}}``, the shape the tool and sandbox
servers' clients and the inference client both read. An unauthenticated client that keeps
streaming is still read (and discarded) until it stops, as by any HTTP server without a body
timeout; it costs the server bandwidth, not memory.

A websocket handshake needs the same bearer token (closed with 1008 otherwise); lifespan
events pass through. The tool server, the sandbox server and the embedded inference server
use it; so must any later server (gateway, env service). Routes that carry large bodies on
purpose (weight updates, uploads) get their own cap in ``Config.route_caps``.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Token"
"""The header that carries a per-session token (tool server sessions, sandbox server sandboxes)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer the guard gives instead of the app."""

    status: int
    type: str
    message: str


Authorize = Callable[["Scope"], "Refusal | None"]
"""Called after the bearer check, before the body is read: a ``Refusal`` answers the request."""


class BodyTooLarge(Exception):
    """Raised by the guarded ``receive`` once a body passes its cap (the guard answers 413)."""


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB ({n} bytes)" if n >= 1 << 16 else f"{n} bytes"


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case) in an ASGI scope."""
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


def bearer_headers(token: str) -> dict[str, str]:
    """The client side: ``{"Authorization": "Bearer <token>"}``, or no header without a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tokens_equal(got: bytes | str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the expected one."""
    if got is None:
        return False
    raw = got.encode() if isinstance(got, str) else got
    return hmac.compare_digest(raw, expected.encode())


class HttpGuard:
    """Pure ASGI middleware: bearer token and ``authorize`` before the body, then a body cap."""

    @dataclass(kw_only=True)
    class Config:
        token: str = ""
        """Bearer token required on every path but ``public_paths`` ("" = no bearer check)."""
        max_body_bytes: int = 16 << 20
        """Largest request body on routes without a cap of their own; larger ones get 413."""
        route_caps: dict[str, int] = field(default_factory=dict)
        """Caps by path (``/update_weights_from_tensor``) or ``fnmatch`` pattern
        (``/sandboxes/*/upload``): an exact path first, else the first matching pattern."""
        public_paths: tuple[str, ...] = ("/health",)
        """Paths served without the bearer token (health checks)."""
        cap_hint: str = "raise the server's body cap"
        """How to raise the cap, said in the 413 message (e.g. the CLI flag)."""

    def __init__(
        self, app: ASGIApp, config: Config | None = None, authorize: Authorize | None = None
    ) -> None:
        self.app = app
        self.config = config or HttpGuard.Config()
        self.authorize = authorize
        self._expected = f"Bearer {self.config.token}".encode()
        self._exact: dict[str, int] = {}  # route caps without wildcards, looked up first
        self._patterns: list[tuple[re.Pattern[str], int]] = []
        for pattern, cap in [("*", self.config.max_body_bytes), *self.config.route_caps.items()]:
            if cap < 0:
                raise ValueError(f"body cap of {pattern!r} must be >= 0 bytes, got {cap}")
        for pattern, cap in self.config.route_caps.items():
            if any(c in pattern for c in "*?["):
                self._patterns.append((re.compile(fnmatch.translate(pattern)), cap))
            else:
                self._exact.setdefault(pattern, cap)

    def cap_for(self, path: str) -> int:
        """The body cap of ``path``: its exact entry, else the first matching pattern's."""
        cap = self._exact.get(path)
        if cap is not None:
            return cap
        for pattern, cap in self._patterns:
            if pattern.match(path):
                return cap
        return self.config.max_body_bytes

    def judge(
        self, scope: Scope, authorization: bytes | None, length: bytes | None, cap: int
    ) -> Refusal | None:
        """The refusal of a request, judged on its head alone (None: let it through)."""
        if scope["path"] in self.config.public_paths:
            return None
        if self.config.token and not hmac.compare_digest(authorization or b"", self._expected):
            return Refusal(
                401,
                "unauthorized",
                "missing or wrong bearer token: send "
                "'Authorization: Bearer <token>' with the server's token",
            )
        if self.authorize is not None and (refusal := self.authorize(scope)) is not None:
            return refusal
        if length is not None:
            if not length.strip().isdigit():
                return Refusal(400, "bad_request", f"Content-Length {length!r} is not a number")
            if int(length) > cap:
                return self.too_large(scope, cap, f"{int(length)} bytes")
        return None

    def too_large(self, scope: Scope, cap: int, size: str) -> Refusal:
        return Refusal(
            413,
            "body_too_large",
            f"request body of {scope['method']} {scope['path']} is {size}; this route "
            f"takes at most {_size(cap)}: send less, or "
            f"{self.config.cap_hint}",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.config.token:  # no body, but the same token
            got = header(scope, b"authorization") or b""
            if not hmac.compare_digest(got, self._expected):
                await send({"type": "websocket.close", "code": 1008})  # policy violation
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = length = None
        chunked = False
        for name, value in scope["headers"]:  # one pass over the head
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        cap = self.cap_for(scope["path"])
        refusal = self.judge(scope, authorization, length, cap)
        if refusal is not None:
            await _answer(send, refusal)
            return
        if length is not None and not chunked:  # HTTP framing stops the body at its length
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send, cap)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        """Run the app on a body without a Content-Length, answering 413 once it passes ``cap``."""
        received = 0
        over = False
        started = False  # the app started its response
        answered = False  # we answered 413 in its place

        async def capped_receive() -> Message:
            nonlocal received, over
            if over:
                raise BodyTooLarge("body over the cap")
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    over = True
                    raise BodyTooLarge(f"body passed {cap} bytes")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started, answered
            if over and not started:  # whatever the app says about it, the answer is 413
                if not answered:
                    answered = True
                    await _answer(send, self.too_large(scope, cap, f"over {cap} bytes"))
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started and not answered:
            await _answer(send, self.too_large(scope, cap, f"over {cap} bytes"))


async def _answer(send: Send, refusal: Refusal) -> None:
    body = json.dumps(
        {"error": {"type": refusal.type, "message": refusal.message, "code": refusal.status}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
