"""``GenerateRoute`` (the raw-ASGI ``POST /generate``) in-process: what it answers itself and
what it passes on. The real server runs it in every /generate test; these cover what those
cannot reach (a handler that fails unexpectedly)."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from agentrl.inference.generate_route import GenerateRoute

BODY = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}


class _Fallback:
    """The app behind the route: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


class _BrokenState:
    def plan(self, req: Any) -> Any:
        raise RuntimeError("the engine's planner broke")


async def _post(route: GenerateRoute, path: str, body: Any) -> httpx2.Response:
    transport = httpx2.ASGITransport(app=route)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(path, content=json.dumps(body))


async def test_an_unexpected_failure_is_a_500_json_error_and_other_routes_pass_on() -> None:
    fallback = _Fallback()
    route = GenerateRoute(fallback, _BrokenState())  # type: ignore[arg-type]
    r = await _post(route, "/generate", BODY)
    assert r.status_code == 500
    assert "RuntimeError: the engine's planner broke" in r.json()["error"]["message"]
    bad = await _post(route, "/generate", {"input_ids": "not ids"})
    assert bad.status_code == 400 and "input_ids" in bad.json()["error"]["message"]
    assert fallback.paths == []  # both answered by the route itself
    assert (await _post(route, "/v1/completions", BODY)).status_code == 204
    transport = httpx2.ASGITransport(app=route)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/generate")).status_code == 204  # not a POST: passed on
    assert fallback.paths == [("POST", "/v1/completions"), ("GET", "/generate")]
