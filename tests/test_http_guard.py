"""HttpGuard as a plain ASGI app, called directly: what reaches the app, what is answered instead.

The servers behind it are tested over real HTTP in tests/toolserver/test_toolserver_guard.py and
tests/inference/test_inference_guard.py."""

from __future__ import annotations

import json
from typing import Any

from agentrl.http import BodyTooLarge, HttpGuard, Refusal


def scope(path: str = "/x", headers: dict[str, str] | None = None, kind: str = "http") -> Any:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": kind, "method": "POST", "path": path, "headers": raw}


def chunks(*parts: bytes) -> Any:
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


class Recorder:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def error(self) -> dict[str, Any]:
        return json.loads(self.messages[1]["body"])["error"]  # type: ignore[no-any-return]


class EchoApp:
    """Reads the whole body and answers it; with ``swallow``, turns any read error into a 400."""

    def __init__(self, swallow: bool = False) -> None:
        self.swallow = swallow
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body = b""
        try:
            while True:
                m = await receive()
                body += m.get("body", b"")
                if not m.get("more_body"):
                    break
        except BodyTooLarge:
            if not self.swallow:
                raise
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"bad body"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


async def test_token_checked_before_the_app_runs_and_public_paths_skip_it() -> None:
    app = EchoApp()
    guard = HttpGuard(app, HttpGuard.Config(token="t"))
    for headers in ({}, {"Authorization": "Bearer x"}, {"Authorization": "t"}):
        out = Recorder()
        await guard(scope(headers=headers), chunks(b"never read"), out)
        assert out.status == 401 and out.error["type"] == "unauthorized"
    assert app.calls == 0
    out = Recorder()
    await guard(scope("/health"), chunks(b""), out)
    assert out.status == 200 and app.calls == 1
    out = Recorder()
    await guard(scope(headers={"Authorization": "Bearer t"}), chunks(b"ok"), out)
    assert out.status == 200 and out.messages[1]["body"] == b"ok"


async def test_authorize_refuses_before_the_body() -> None:
    app = EchoApp()
    guard = HttpGuard(app, authorize=lambda s: Refusal(403, "nope", "not yours"))
    out = Recorder()
    await guard(scope(), chunks(b"x"), out)
    assert (out.status, out.error["type"], out.error["code"]) == (403, "nope", 403)
    assert app.calls == 0


async def test_chunked_bodies_are_counted_and_the_answer_is_413_whatever_the_app_says() -> None:
    for swallow in (False, True):
        app = EchoApp(swallow=swallow)
        guard = HttpGuard(app, HttpGuard.Config(max_body_bytes=10))
        out = Recorder()
        await guard(scope(), chunks(b"12345", b"67890", b"1"), out)
        assert [m["type"] for m in out.messages] == ["http.response.start", "http.response.body"]
        assert out.status == 413 and "at most 10 bytes" in out.error["message"]
        out = Recorder()
        await guard(scope(), chunks(b"12345", b"67890"), out)  # exactly the cap
        assert out.status == 200 and out.messages[1]["body"] == b"1234567890"


async def test_content_length_over_the_route_cap_is_413_unread() -> None:
    app = EchoApp()
    caps = {"/big": 100, "/files/*/upload": 50}
    guard = HttpGuard(app, HttpGuard.Config(max_body_bytes=10, route_caps=caps))
    assert [guard.cap_for(p) for p in ("/x", "/big", "/files/a/upload")] == [10, 100, 50]
    out = Recorder()
    await guard(scope("/x", {"Content-Length": "11"}), chunks(b"x" * 11), out)
    assert out.status == 413 and "POST /x is 11 bytes" in out.error["message"]
    out = Recorder()
    await guard(scope("/big", {"Content-Length": "11"}), chunks(b"x" * 11), out)
    assert out.status == 200
    assert app.calls == 1


async def test_lifespan_passes_and_websockets_need_the_token() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    guard = HttpGuard(app, HttpGuard.Config(token="t"))
    await guard(scope(kind="lifespan"), chunks(), Recorder())
    out = Recorder()
    await guard(scope(kind="websocket"), chunks(), out)
    assert out.messages == [{"type": "websocket.close", "code": 1008}]
    await guard(scope(kind="websocket", headers={"Authorization": "Bearer t"}), chunks(), out)
    assert seen == ["lifespan", "websocket"]
