"""The env server's hot path below FastAPI: raw-ASGI routes and a coalescing transport.

``HotRoutes`` answers open (+ reset), reset, step, demonstration, tool calls and batched
close without FastAPI's per-request machinery (routing, dependency solving, exception
middleware), which cost more CPU than a step of most envs; everything else goes on to the
FastAPI app. ``http_protocol()`` gives uvicorn a protocol whose writes of one event-loop turn
leave in one ``send``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from agentrl.envserver.api import (
    CloseRequest,
    DemonstrationRequest,
    OpenRequest,
    ResetRequest,
    StepRequest,
    ToolCallRequest,
)
from agentrl.envserver.wire import MEDIA_TYPE
from agentrl.http import ApiError, BodyTooLarge, error_body
from agentrl.http.asgi import ClientGone, answer, read_body

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from agentrl.envserver.server import EnvServer

logger = logging.getLogger(__name__)

_FRAME = MEDIA_TYPE.encode()
_JSON = b"application/json"


class HotRoutes:
    """Raw ASGI: open (+ reset), reset, step, tool calls and batched close, without FastAPI.

    Sits inside ``HttpGuard`` (bearer and session tokens, body caps are checked before it
    runs); every other request goes on to the FastAPI app. Errors are the same JSON as
    ``install_error_handlers`` writes."""

    def __init__(self, app: ASGIApp, server: EnvServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        parts = scope["path"].split("/")  # ["", "sessions", id, what...]
        n = len(parts)
        if n < 2 or parts[1] != "sessions":
            await self.app(scope, receive, send)
            return
        srv = self.server
        try:
            if n == 2:
                req = srv._parse(OpenRequest, await read_body(receive))
                if req.reset is not None:
                    await answer(send, 200, _FRAME, await srv.open_and_reset(req))
                    return
                s = await srv.open_session(req)
                out = {"session_id": s.id, "session_token": s.token, **srv._describe(s.env)}
                await answer(send, 200, _JSON, _dumps(out))
            elif n == 3 and parts[2] == "close":
                close = srv._parse(CloseRequest, await read_body(receive))
                await answer(send, 200, _JSON, _dumps(await srv.close_many(close)))
            elif n == 4 and parts[3] in ("reset", "step", "demonstration"):
                sid, body = parts[2], await read_body(receive)
                if parts[3] == "step":
                    step = srv._parse(StepRequest, body)
                    frame = await srv._run(
                        sid, step.request_id, "step", lambda s: srv._step(s, step)
                    )
                elif parts[3] == "demonstration":
                    demo = srv._parse(DemonstrationRequest, body)
                    frame = await srv._run(
                        sid, demo.request_id, "demonstration", srv._demonstration
                    )
                else:
                    reset = srv._parse(ResetRequest, body)
                    frame = await srv._run(
                        sid, reset.request_id, "reset", lambda s: srv._reset(s, reset)
                    )
                await answer(send, 200, _FRAME, frame)
            elif n == 5 and parts[3] == "tools" and parts[4] == "call":
                call = srv._parse(ToolCallRequest, await read_body(receive))
                frame = await srv._run(
                    parts[2],
                    call.request_id,
                    f"tool {call.name}",
                    lambda s: srv._tool_call(s, call),
                )
                await answer(send, 200, _FRAME, frame)
            else:
                await self.app(scope, receive, send)
        except ApiError as e:
            await answer(send, e.status, _JSON, _dumps(error_body(e.type, e.message)))
        except (BodyTooLarge, ClientGone):
            raise
        except Exception as e:
            logger.exception("unhandled error in a request")
            body = _dumps(error_body("internal", f"{type(e).__name__}: {e}"))
            await answer(send, 500, _JSON, body)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _CoalescingTransport:
    """A transport whose writes in one event-loop turn leave in one ``send``.

    uvicorn writes a response's head and its body separately: two syscalls and two packets
    per answer, and on loopback the receiver's wakeup is paid inside each send. Buffered until
    the end of the turn (or 64 KiB), an answer is one of each. Everything else is the
    transport's own (``close`` and the like write what is buffered first)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._buf:
            self._loop.call_soon(self.flush)
        self._buf.append(bytes(data))
        self._size += len(data)
        if self._size >= 1 << 16:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
            self._buf, self._size = [], 0
            if not self._t.is_closing():
                self._t.write(data)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``_CoalescingTransport`` (``uvicorn.run(http=...)``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class CoalescingHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            assert isinstance(transport, asyncio.Transport)
            super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    return CoalescingHttpToolsProtocol
