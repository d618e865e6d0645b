"""``POST /generate`` (SGLang's native API) as a raw-ASGI route of the embedded server.

    GenerateRoute (inside HttpGuard) -> generate(): body -> GenerateRequest -> ServerState.plan
        -> Jobs -> ServerState.run (engine thread) -> ServerState.respond -> JSON or SSE

Raw ASGI rather than a FastAPI route because the HTTP thread shares the GIL with the engine
thread: whatever a request costs in Python is taken from the engine (docs/guides/inference.md,
"Where that generation goes"). Every other route stays on the FastAPI app behind it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Response
from fastapi.responses import StreamingResponse

from agentrl.errors import ConfigError
from agentrl.http import BodyTooLarge, json_response, parse_body
from agentrl.http.asgi import ClientGone, read_body
from agentrl.inference.responses import error_response
from agentrl.inference.wire import GenerateRequest, error_body

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from agentrl.inference.server import Job, ServerState

logger = logging.getLogger("agentrl.inference.server")


async def generate(state: ServerState, body: bytes) -> Response:
    """The answer to one ``POST /generate`` body (SGLang's JSON; a stream when it asks)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        req = parse_body(GenerateRequest, body)
        jobs, single = state.plan(req)
    except ConfigError as exc:
        return error_response(str(exc), 400)
    if req.stream:
        return StreamingResponse(
            _stream_generate(state, jobs[0], start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    if len(jobs) == 1:
        j = jobs[0]
        results = [await state.run(j.rid, j.input_ids, j.params, images=j.images)]
    else:
        results = await asyncio.gather(*(state.run(j.rid, j.input_ids, j.params) for j in jobs))
    failed = next((r.error for r in results if r.error), None)
    if failed:
        return error_response(f"engine failed: {failed}", 500)
    latency = loop.time() - start
    out = [state.respond(j, r, latency) for j, r in zip(jobs, results, strict=True)]
    return json_response(out[0] if single else out)


class GenerateRoute:
    """Raw ASGI (``agentrl.http.asgi``): ``POST /generate`` without FastAPI's per-request
    machinery; every other request goes on to the FastAPI app.

    The HTTP thread shares the GIL with the engine thread, so its CPU per request is taken
    from the engine: measured on one H100 with the GPU quickstart's requests (256 a round),
    the HTTP thread spent 82 ms of CPU a round and the engine's prefills took 17 ms each
    through HTTP against 4.5 ms in-process; FastAPI's routing and middleware were over half
    of that thread's work per request (docs/guides/inference.md)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await generate(self.state, await read_body(receive))
        except (BodyTooLarge, ClientGone):
            raise  # HttpGuard answers 413; a client that left gets nothing
        except Exception as exc:
            logger.exception("unhandled error in /generate")
            response = error_response(f"{type(exc).__name__}: {exc}", 500)
        await response(scope, receive, send)


async def _stream_generate(state: ServerState, job: Job, start: float) -> AsyncIterator[bytes]:
    """SSE of one /generate request as SGLang streams it by default: each event carries the
    output ids so far (cumulative); the last one is the whole answer, then ``[DONE]``."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    task = asyncio.create_task(
        state.run(job.rid, job.input_ids, job.params, queue.put_nowait, images=job.images)
    )
    task.add_done_callback(lambda _t: queue.put_nowait(None))
    ids: list[int] = []
    try:
        while (tok := await queue.get()) is not None:
            ids.append(tok)
            event = {"output_ids": ids, "meta_info": {"id": job.rid, "finish_reason": None}}
            yield b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
        res = await task
        if res.error:
            body: dict[str, object] = error_body(f"engine failed: {res.error}", status=500)
        else:
            body = state.respond(job, res, loop.time() - start)
        yield b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not task.done():  # the client went away: abort the request
            task.cancel()
