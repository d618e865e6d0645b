"""Raw-ASGI pieces for a server's hot routes, below FastAPI.

FastAPI's per-request machinery (routing, dependency solving, exception and telemetry
middleware) costs more CPU than the work of a hot route: an env step, or queueing a
``/generate`` request for the inference engine, whose thread then waits on the same GIL.
A hot route is a small pure-ASGI class inside ``HttpGuard`` (tokens and body caps are
checked before it runs) that answers its paths with these helpers and passes every other
request on to the FastAPI app:

    HttpGuard(HotRoutes(fastapi_app, ...), config=...)
        read_body(receive) -> bytes        (ClientGone when the client left first)
        answer(send, status, content_type, body)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import Receive, Send

__all__ = ["ClientGone", "answer", "read_body"]


class ClientGone(Exception):
    """The client disconnected before its body arrived."""


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return bytes(body)
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def answer(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    """A whole response: status, content type and length, body."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
