"""The server side of agentrl's HTTP services (tool server, sandbox server, inference server).

    app = FastAPI(**NO_DOCS)
    install_error_handlers(app)                          # every failure -> {"error": {...}} JSON
    app.add_middleware(HttpGuard, config=HttpGuard.Config(token=token), authorize=...)
    check_bind(host, token, token_env=...)                # no token off loopback: refuse

Request -> ``HttpGuard`` (``agentrl.http.guard``: bearer token and per-session token checked
before the body is read, body cap) -> handler -> a ``ReplayCache`` keyed by the client's
``request_id`` (a retried request returns the first answer, it never runs twice) -> JSON.
``TokenBucket`` rate-limits a session. Routes that take raw bytes parse them with
``parse_body`` (a pydantic model; one readable line per validation error) and answer with
``json_response`` (raw JSON, no per-request encoder). ``ServerThread`` runs an app under
uvicorn in a background thread (tests, embedding); the CLIs run it in the main one.

Servers run on asyncio's own event loop (``SERVER_LOOP``), not uvloop: libuv (1.45+) accepts
one connection per loop iteration, and a loop busy starting sandbox processes then takes
seconds to take in a burst of new connections (200 sessions opening connections at once: the
last waited ~10 s to be accepted); asyncio accepts all pending connections at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.errors import ConfigError
from agentrl.http.guard import is_loopback

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
NO_DOCS: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None}
"""FastAPI kwargs: no unauthenticated /docs, /redoc or /openapi.json."""
SERVER_LOOP = "asyncio"
"""uvicorn's ``loop`` for these servers: asyncio accepts every pending connection per loop
iteration, uvloop only one (see the module docstring). The cost: on Python 3.11 asyncio waits
for each child process from a thread of its own (two per local sandbox: agent and bash)."""


class ApiError(Exception):
    """An error the server answers with ``{"error": {"type": ..., "message": ...}}``."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message


def error_body(type: str, message: str) -> dict[str, Any]:
    return {"error": {"type": type, "message": message}}


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure a structured JSON error (never an HTML page or a bare 500)."""

    async def api_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, ApiError)
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return JSONResponse(error_body(e.type, e.message), status_code=e.status, headers=headers)

    async def bad_request(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RequestValidationError)
        return JSONResponse(error_body("bad_request", str(e.errors())), status_code=422)

    async def internal(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error in a request")
        return JSONResponse(error_body("internal", f"{type(e).__name__}: {e}"), status_code=500)

    async def http_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, StarletteHTTPException)
        return JSONResponse(error_body("http", str(e.detail)), status_code=e.status_code)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(Exception, internal)


def json_response(obj: object, status: int = 200) -> Response:
    """``obj`` as compact JSON, written directly (no FastAPI encoder pass)."""
    return Response(json.dumps(obj, separators=(",", ":")), status, media_type="application/json")


def validation_message(exc: ValidationError) -> str:
    """One readable line per error; union branches (``list[int]``, model names) left out."""
    errors = exc.errors()
    real = [e for e in errors if "valid list" not in e["msg"] and "valid array" not in e["msg"]]
    parts: list[str] = []
    for err in real or errors:
        loc = ".".join(
            str(x) for x in err["loc"] if not (isinstance(x, str) and ("[" in x or x[:1].isupper()))
        )
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        line = f"{loc}: {msg}" if loc else msg
        if line not in parts:
            parts.append(line)
    return "invalid request: " + "; ".join(parts[:4])


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body; ConfigError with a readable message otherwise."""
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise ConfigError(validation_message(exc)) from exc


def check_bind(host: str, token: str, *, token_env: str, serves: str = "call it") -> None:
    """Refuse to listen beyond this machine without a token (``token_env`` names its variable)."""
    if not token and not is_loopback(host):
        raise ConfigError(
            f"refusing to bind {host!r} without a token: anyone who can reach it could "
            f"{serves}. Pass --token (or set {token_env}), or bind 127.0.0.1."
        )
    if not token:
        logger.warning("serving on %s without a token: any local user can call it", host)


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ConfigError(
                f"rate limit needs rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}"
            )
        self.rate = rate_per_s
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> float:
        """Take a token: 0.0 if there was one, else the seconds until there will be."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


class ReplayCache(Generic[T]):
    """Answers by request id: a repeated id gets the first answer (waiting if it is running).

    Failures (exceptions) are not kept, so a retry after one runs again. The oldest finished
    answers are dropped past ``size``.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._futs: OrderedDict[str, asyncio.Future[T]] = OrderedDict()

    def get(self, request_id: str) -> asyncio.Future[T] | None:
        return self._futs.get(request_id) if request_id else None

    async def run(self, request_id: str, fn: Callable[[], Awaitable[T]]) -> T:
        if not request_id:
            return await fn()
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._futs[request_id] = fut
        try:
            value = await fn()
        except BaseException as e:
            self._futs.pop(request_id, None)
            if isinstance(e, Exception):
                fut.set_exception(e)
                fut.exception()  # mark retrieved: waiters re-raise it, nobody else must
            else:
                fut.cancel()
            raise
        fut.set_result(value)
        while len(self._futs) > self.size:
            oldest = next(iter(self._futs))
            if not self._futs[oldest].done():
                break
            del self._futs[oldest]
        return value


class ServerThread:
    """Run an ASGI app with uvicorn in a daemon thread, on ``host:port`` (0 = any free port).

    with ServerThread(app) as url:   # "http://127.0.0.1:PORT"
        httpx2.get(url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", loop=SERVER_LOOP
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="uvicorn")
        self.host = host
        self.url = ""

    def start(self, timeout_s: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start; see its log")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
