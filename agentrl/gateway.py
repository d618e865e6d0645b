"""The recording gateway: an OpenAI Chat Completions endpoint per trajectory, token-exact.

    black-box agent --POST {base_url}/chat/completions (key of its trajectory)--> Gateway
      -> GatewaySession.complete: messages vs the conversation so far
           extends it      -> ctx.generate(): the ledger appends the template's delta (mask 0)
           rewrote history -> ctx.new_segment() first: a full render in a new segment
      -> RolloutContext.generate -> the rollout's Generator (token ids in, token ids out)
      -> reply parsed by agentrl.tool_parsers -> OpenAI JSON (or SSE chunks) -> agent

One ``Gateway`` (an aiohttp server on loopback, in the rollouts' own event loop) serves every
trajectory of a process; ``Gateway.open(ctx)`` gives a trajectory a ``GatewaySession`` with its
own ``base_url`` (``http://127.0.0.1:PORT/t/<id>/v1``) and key. A key only reaches its own
session: another trajectory's path answers 403, an unknown key 401.

What is recorded is what the model saw: the prompt of each request is rendered with
agentrl's chat template (``ChatTemplate``) and sent as token ids; the completion ids, logprobs
and weight versions are the server's, never re-tokenized. A request whose messages start with
the whole conversation so far (the assistant messages exactly as returned, whitespace aside)
extends the same segment, so a multi-turn episode is one sequence; consecutive tool results
are rendered together (no extra turn boundary). Anything else (a truncated or summarised
history, an edited message, changed tools) starts a new segment whose prompt is a full render
of the new messages: every token of it has loss mask 0, since none can be proven sampled, and
the kind of divergence is counted in ``ctx.metrics`` (``gateway_rewrite_<kind>``).

Streaming is real when the generator is a ``StreamingGenerator``: content deltas leave as the
tokens arrive (text that could still turn into a tool call or a stop string is held back).
Stop strings are ours on every backend: the server is not sent them; the reply streams in,
and at the token that completes one, ``generate_stream(cut=...)`` aborts the request, so the
ledger holds exactly the ids sampled up to it. ``top_logprobs`` are the server's (a generator
that cannot report them gets a 400). A stream that breaks after tokens arrived is an error
event for the agent and ``error_inference`` for the trajectory, its tokens at loss mask 0.
Errors are OpenAI error objects. Each request and response is kept in ``session.log``
(``Trajectory.report["gateway"]``), for the trajectory viewer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agentrl.agent import RolloutContext, RolloutStop
from agentrl.errors import AbortedError, InferenceError, StreamBrokenError
from agentrl.inference import openai_chat as oc
from agentrl.inference.protocol import (
    Completion,
    Cut,
    SamplingParams,
    StreamingGenerator,
    cut_completion,
)
from agentrl.tool_parsers import ToolParser, get_tool_parser
from agentrl.types import JSON, Message, RolloutStatus, Segment

logger = logging.getLogger(__name__)

REWRITE_KINDS = ("truncated", "assistant_edited", "history_edited", "tools_changed")
"""How a request can fail to extend the conversation (``gateway_rewrite_<kind>`` metrics)."""


class GatewayContext(RolloutContext):
    """A RolloutContext whose replies are parsed and streamed the way a gateway request asks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stops: tuple[str, ...] = ()
        self.tools_on = False
        self.stop_hit = False
        self.on_tokens: Callable[[list[int]], None] | None = None
        self.snapshots: list[tuple[list[Message], dict[int, int], int]] = []
        self._parser: ToolParser | None = None
        for kind in REWRITE_KINDS:
            self.metrics[f"gateway_rewrite_{kind}"] = 0.0

    @property
    def parser(self) -> ToolParser:
        """The collector's tool parser, or Hermes (made once per trajectory)."""
        if self._parser is None:
            self._parser = self.tool_parser or get_tool_parser("hermes")
        return self._parser

    def parse_actions(self, text: str, finish_reason: str) -> tuple[Message, list[str]]:
        if self.stops:
            text, self.stop_hit = oc.cut_at_stop(text, self.stops)
        else:
            self.stop_hit = False
        return oc.reply_message(text, finish_reason, self.parser, self.tools_on)

    async def call_model(self, input_ids: list[int], sampling: SamplingParams) -> Completion:
        """Generate; with stop strings, stream and end the request at the token that completes
        one (every backend: the server is never asked to detokenize)."""
        on_tokens = self.on_tokens
        cut = stop_cut(self.template.decode, self.stops) if self.stops else None
        if (on_tokens is None and cut is None) or not isinstance(
            self.generator, StreamingGenerator
        ):
            c = await super().call_model(input_ids, sampling)
            n = cut(c.output_ids) if cut is not None else None
            return c if n is None else cut_completion(c, n)
        final: Completion | None = None
        async for item in self.generator.generate_stream(
            input_ids, sampling, session_id=self.session_id, cut=cut
        ):
            if isinstance(item, Completion):
                final = item
            elif on_tokens is not None:
                on_tokens(item)
        if final is None:
            raise InferenceError("the generator's stream ended without a Completion")
        return final

    def record_broken(self, e: StreamBrokenError) -> None:
        """A stream broke mid-reply: its tokens go into the ledger with loss mask 0 (the
        reply never reached the conversation) and the segment is closed."""
        if self.ledger.segments:
            seg = self.ledger.segments[-1]
            seg.extend_prompt(e.output_ids)
            self.ledger.raw_segments.add(len(self.ledger.segments) - 1)  # not a render now
        self.new_segment()
        self.metrics["gateway_stream_broken"] = 1.0
        self.metrics["gateway_stream_broken_tokens"] = float(len(e.output_ids))

    def rewrite(self, messages: list[Message], tools: list[JSON] | None, kind: str) -> None:
        """Replace the conversation (the harness rewrote it): the next prompt is a new segment."""
        self.metrics[f"gateway_rewrite_{kind}"] += 1
        self.snapshots.append((self.messages, self._turn_of_message, len(self.ledger.segments)))
        self.new_segment()
        self.messages = list(messages)
        self._turn_of_message = {}
        self.ledger.tools = tools

    def check_ledger(self) -> list[tuple[int, Any]]:
        """Each segment against a full render of the conversation it was built from."""
        views = [*self.snapshots, (self.messages, self._turn_of_message, len(self.ledger.segments))]
        out, first = [], 0
        for msgs, turn_of, end in views:
            for i in range(first, end):
                if i in self.ledger.raw_segments:
                    continue
                n = self.ledger.segment_messages[i]
                conv = list(msgs[:n])
                for k in self.ledger.completion_messages[i]:
                    ids = self.turns[turn_of[k]].completion_ids
                    conv[k] = Message(role="assistant", content=self.template.completion_text(ids))
                seg = self.ledger.segments[i]
                out.append((i, self.template.check_ledger(conv, seg.token_ids, self.ledger.tools)))
            first = end
        return out


def stop_cut(decode: Callable[[list[int]], str], stops: tuple[str, ...]) -> Cut:
    """A ``cut`` for ``generate_stream``: the number of tokens up to and including the one
    that completes a stop string. Each token is checked once, on a window of the last tokens
    wide enough to hold the longest stop string."""
    width = max(len(s) for s in stops) + 2
    checked = 0

    def cut(ids: list[int]) -> int | None:
        nonlocal checked
        for j in range(checked, len(ids)):
            tail = decode(ids[max(0, j + 1 - width) : j + 1])
            if any(s in tail for s in stops):
                return j + 1
        checked = len(ids)
        return None

    return cut


def _same(a: Message, b: Message) -> bool:
    """Whether a message the agent sent back is the one the conversation holds."""
    if a is b:  # reused by GatewaySession._messages: the same JSON as last time
        return True
    if a.role != b.role or (a.role == "tool" and a.tool_call_id != b.tool_call_id):
        return False
    ca = a.content.strip() if isinstance(a.content, str) else json.dumps(a.content)
    cb = b.content.strip() if isinstance(b.content, str) else json.dumps(b.content)
    if ca != cb:
        return False
    calls = [
        [(t.id, t.name, json.dumps(t.arguments, sort_keys=True)) for t in m.tool_calls]
        for m in (a, b)
    ]
    return calls[0] == calls[1]


@dataclasses.dataclass(slots=True)
class _Answer:
    message: Message
    reason: str
    completion: Completion
    segment: Segment
    prompt_len: int
    rewrite: str | None

    @property
    def prompt_ids(self) -> list[int]:
        return self.segment.token_ids[: self.prompt_len]


class GatewaySession:
    """One trajectory's endpoint: its key, its conversation (``ctx``) and its request log."""

    def __init__(
        self,
        gateway: Gateway,
        ctx: GatewayContext,
        *,
        honor_sampling: bool = False,
        model: str = "agentrl",
    ) -> None:
        self.gateway = gateway
        self.ctx = ctx
        self.id = secrets.token_hex(8)
        self.key = "sk-agentrl-" + secrets.token_urlsafe(24)
        self.honor_sampling = honor_sampling
        self.model = model
        self.requests = 0
        self.log: list[JSON] = []
        self.stop: RolloutStop | None = None  # a limit a request ran into
        self.failure: Exception | None = None  # an inference failure
        self.closed = False
        self._lock = asyncio.Lock()
        self._raw: list[dict[str, Any]] = []  # the last request's messages, as sent

    def _messages(self, req: oc.ChatRequest) -> list[Message]:
        """The request's messages. The leading ones that are the same JSON as the previous
        request's are the conversation's own ``Message`` objects (the conversation holds
        that request's messages first), so only the new ones are converted and compared."""
        raw, prev = req.messages, self._raw
        n = min(len(raw), len(prev), len(self.ctx.messages))
        k = 0
        while k < n and raw[k] == prev[k]:
            k += 1
        if k == 0:
            return oc.request_messages(req)
        return [*self.ctx.messages[:k], *oc.request_messages(req, k)]

    @property
    def base_url(self) -> str:
        return f"{self.gateway.url}/t/{self.id}/v1"

    def _sync(self, msgs: list[Message], tools: list[JSON] | None) -> str | None:
        """Extend the conversation with the request's new messages, or rewrite it (the kind)."""
        ctx = self.ctx
        prev = ctx.messages
        if not ctx.ledger.segments:  # the first request sets the tools shown to the model
            ctx.messages = list(msgs)
            ctx.ledger.tools = tools
            return None
        kind: str | None = None
        if (tools or None) != (ctx.ledger.tools or None):
            kind = "tools_changed"
        else:
            bad = next(
                (i for i, (a, b) in enumerate(zip(prev, msgs, strict=False)) if not _same(a, b)),
                None,
            )
            if bad is not None:
                if any(_same(p, msgs[bad]) for p in prev[bad + 1 :]):
                    kind = "truncated"  # messages were dropped (a summary may stand for them)
                elif prev[bad].role == "assistant":
                    kind = "assistant_edited"
                else:
                    kind = "history_edited"
            elif len(msgs) <= len(prev):
                kind = "truncated"
        if kind is None:
            ctx.messages.extend(msgs[len(prev) :])
        else:
            ctx.rewrite(msgs, tools, kind)
        return kind

    def _sampling(self, req: oc.ChatRequest) -> SamplingParams:
        """The request's sampling. Stop strings are not sent: ``GatewayContext`` cuts at them."""
        sp = self.ctx.sampling
        top = self._top_logprobs(req)
        stop_ids = (*sp.stop_token_ids, *(req.stop_token_ids or ()))
        if not self.honor_sampling:
            if stop_ids == sp.stop_token_ids and top == sp.top_logprobs:
                return sp
            return dataclasses.replace(sp, stop_token_ids=stop_ids, top_logprobs=top)
        if req.ignore_eos:  # only the request's own stop ids end it
            stop_ids = tuple(req.stop_token_ids or ())
        return dataclasses.replace(
            sp,
            ignore_eos=req.ignore_eos,
            temperature=sp.temperature if req.temperature is None else req.temperature,
            top_p=sp.top_p if req.top_p is None else req.top_p,
            top_k=req.top_k if req.top_k > 0 else sp.top_k,
            seed=req.seed if req.seed is not None else sp.seed,
            stop_token_ids=stop_ids,
            top_logprobs=top,
        )

    def _top_logprobs(self, req: oc.ChatRequest) -> int:
        """How many alternatives to ask the server for; a 400 where it cannot give them."""
        if not (req.logprobs and req.top_logprobs):
            return 0
        gen = self.ctx.generator
        if not getattr(gen, "supports_top_logprobs", False):
            raise oc.OpenAIError(
                f"top_logprobs={req.top_logprobs}: this rollout's generator "
                f"({type(gen).__name__}) does not report alternative tokens. Send logprobs "
                "without top_logprobs, or generate through InferenceClient (the embedded "
                "server, SGLang or vLLM).",
                param="top_logprobs",
                code="top_logprobs_unsupported",
            )
        return req.top_logprobs

    async def complete(
        self, req: oc.ChatRequest, on_tokens: Callable[[list[int]], None] | None = None
    ) -> _Answer:
        """Serve one request through the rollout's context (requests of a session queue up)."""
        async with self._lock:
            if self.closed:
                raise oc.OpenAIError(
                    "this trajectory has ended; its key no longer serves requests",
                    status=409,
                    code="trajectory_ended",
                )
            if isinstance(self.failure, StreamBrokenError):
                raise oc.OpenAIError(
                    f"this trajectory failed (status error_inference): {self.failure}",
                    status=502,
                    type="server_error",
                    code="trajectory_failed",
                )
            msgs = self._messages(req)
            ctx = self.ctx
            saved = ctx.sampling
            sampling = self._sampling(req)
            kind = self._sync(msgs, req.tools)
            self._raw = req.messages
            ctx.stops, ctx.tools_on = req.stops, bool(req.tools) and req.tool_choice != "none"
            ctx.sampling, ctx.on_tokens = sampling, on_tokens
            self.requests += 1
            try:
                reply = await ctx.generate(max_new_tokens=req.limit)
            except StreamBrokenError as e:
                self.failure = e
                ctx.record_broken(e)
                raise oc.OpenAIError(
                    f"the inference server's stream broke after {len(e.output_ids)} tokens "
                    f"({e}); the partial reply is not returned and this trajectory ends with "
                    "status error_inference",
                    status=502,
                    type="server_error",
                    code="upstream_stream_broken",
                ) from None
            except RolloutStop as e:
                self.stop = e
                code = (
                    "context_length_exceeded"
                    if e.status is RolloutStatus.TRUNCATED_LENGTH
                    else "max_turns_exceeded"
                )
                raise oc.OpenAIError(str(e), code=code) from None
            except (InferenceError, AbortedError) as e:
                self.failure = e
                raise oc.OpenAIError(
                    f"inference failed: {e}", status=502, type="server_error"
                ) from None
            finally:
                ctx.sampling, ctx.on_tokens = saved, None
            c = reply.completion
            seg = ctx.ledger.segments[-1]
            reason = "stop" if ctx.stop_hit else reply.finish_reason
            if sampling.top_logprobs and c.output_top_logprobs is None:
                raise oc.OpenAIError(
                    f"top_logprobs={sampling.top_logprobs} was asked for, but the inference "
                    f"server ({c.server or 'the generator'}) returned none",
                    status=502,
                    type="server_error",
                    code="top_logprobs_missing",
                )
            return _Answer(reply.message, reason, c, seg, len(seg) - len(c.output_ids), kind)

    def body(self, req: oc.ChatRequest, a: _Answer, id: str | None = None) -> JSON:
        """The non-streaming response body."""
        c = a.completion
        extra = {"prompt_token_ids": a.prompt_ids, "token_ids": c.output_ids}
        lp = self.logprobs(c, req.top_logprobs) if req.logprobs else None
        return oc.chat_completion(
            req.model or self.model,
            [
                oc.choice(
                    0, a.message, a.reason, logprobs=lp, **(extra if req.return_token_ids else {})
                )
            ],
            oc.usage(a.prompt_len, len(c.output_ids)),
            id=id,
        )

    def logprobs(self, c: Completion, top: int = 0) -> JSON:
        rows = None
        if top and c.output_top_logprobs is not None:
            rows = [row[:top] for row in c.output_top_logprobs]
        return oc.logprobs_json(self.ctx.template.decode, c.output_ids, c.output_logprobs, rows)

    def record(self, req: JSON, resp: JSON, status: int, t0: float, a: _Answer | None) -> None:
        entry: JSON = {
            "time": t0,
            "latency_s": time.time() - t0,
            "status": status,
            "request": req,
            "response": resp,
        }
        if a is not None:
            entry.update(segment=len(self.ctx.ledger.segments) - 1, rewrite=a.rewrite)
        self.log.append(entry)

    def report(self) -> JSON:
        return {
            "session": self.id,
            "requests": self.requests,
            "segments": len(self.ctx.ledger.segments),
            "log": self.log,
        }


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gateway] = weakref.WeakKeyDictionary()


class Gateway:
    """The HTTP server every ``GatewaySession`` of this event loop is reached through."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.url = ""
        self._sessions: dict[str, GatewaySession] = {}
        self._runner: web.AppRunner | None = None
        self._start_lock = asyncio.Lock()

    @classmethod
    async def shared(cls) -> Gateway:
        """This event loop's gateway, started on first use."""
        loop = asyncio.get_running_loop()
        gw = _SHARED.get(loop)
        if gw is None:
            gw = _SHARED[loop] = cls()
        await gw.start()
        return gw

    async def start(self) -> str:
        async with self._start_lock:
            if self._runner is None:
                app = web.Application(client_max_size=64 * 2**20)
                for prefix in ("/v1", "/t/{sid}/v1"):
                    app.router.add_get(prefix + "/models", self._models)
                    app.router.add_post(prefix + "/chat/completions", self._chat)
                app.router.add_route("*", "/{tail:.*}", self._unknown)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, self.host, self.port)
                await site.start()
                sock = site._server.sockets[0]  # type: ignore[union-attr]
                self.port = sock.getsockname()[1]
                self.url = f"http://{self.host}:{self.port}"
                self._runner = runner
        return self.url

    def open(self, ctx: GatewayContext, **kwargs: Any) -> GatewaySession:
        """A new session (its own base_url and key) serving ``ctx``."""
        if not self.url:
            raise RuntimeError("Gateway.open() before start()")
        s = GatewaySession(self, ctx, **kwargs)
        self._sessions[s.key] = s
        return s

    def close(self, session: GatewaySession) -> None:
        session.closed = True
        self._sessions.pop(session.key, None)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- HTTP -------------------------------------------------------------------------------
    def _session(self, request: web.Request) -> GatewaySession:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("api-key")
        s = self._sessions.get(key or "")
        if s is None:
            raise oc.OpenAIError(
                "invalid or expired API key: use the key given with this trajectory's base_url",
                status=401,
                type="authentication_error",
                code="invalid_api_key",
            )
        sid = request.match_info.get("sid")
        if sid is not None and sid != s.id:
            raise oc.OpenAIError(
                "this key belongs to another trajectory's base_url",
                status=403,
                type="permission_error",
                code="wrong_trajectory",
            )
        return s

    @staticmethod
    def _error(e: oc.OpenAIError) -> web.Response:
        return web.json_response(e.body(), status=e.status)

    async def _unknown(self, request: web.Request) -> web.Response:
        hint = (
            " The Responses API is not supported; use Chat Completions."
            if "/responses" in request.path
            else ""
        )
        return self._error(
            oc.OpenAIError(
                f"no route {request.method} {request.path}: the gateway serves GET /v1/models "
                f"and POST /v1/chat/completions.{hint}",
                status=404,
                code="unknown_url",
            )
        )

    async def _models(self, request: web.Request) -> web.Response:
        try:
            s = self._session(request)
        except oc.OpenAIError as e:
            return self._error(e)
        return web.json_response(oc.models_list(s.model))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        t0 = time.time()
        try:
            s = self._session(request)
        except oc.OpenAIError as e:
            return self._error(e)
        raw = await request.read()
        body: Any = raw  # bytes that are not JSON: parse_chat_request says so
        try:
            body = logged = json.loads(raw)
        except ValueError:
            logged = {"raw": raw[:2000].decode(errors="replace")}
        try:
            req = oc.parse_chat_request(body)
            if req.stream:
                return await self._stream(request, s, req, logged, t0)
            a = await s.complete(req)
        except oc.OpenAIError as e:
            s.record(logged, e.body(), e.status, t0, None)
            return self._error(e)
        body = s.body(req, a)
        s.record(logged, body, 200, t0, a)
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        s: GatewaySession,
        req: oc.ChatRequest,
        logged: JSON,
        t0: float,
    ) -> web.StreamResponse:
        queue: asyncio.Queue[list[int] | None] = asyncio.Queue()
        task = asyncio.create_task(s.complete(req, on_tokens=queue.put_nowait))
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        cid, created, model = oc.new_id(), int(time.time()), req.model or s.model
        await resp.write(
            oc.sse(oc.chunk(cid, model, created, {"role": "assistant", "content": ""}))
        )
        template = s.ctx.template
        tools_on = bool(req.tools) and req.tool_choice != "none"
        text = oc.TextStream(
            hold=[getattr(s.ctx.parser, "open_tag", "")] if tools_on else [],
            stops=req.stops,
            strip=tools_on,
        )
        ids: list[int] = []
        try:
            while (item := await queue.get()) is not None:
                ids.extend(item)
                shown = ids[:-1] if template.ends_turn(ids) else ids
                delta = text.push(template.content_prefix + template.decode(shown))
                if delta:
                    await resp.write(oc.sse(oc.chunk(cid, model, created, {"content": delta})))
            a = await task
        except oc.OpenAIError as e:
            await resp.write(oc.sse(e.body()))
            await resp.write(oc.sse("[DONE]"))
            s.record(logged, e.body(), e.status, t0, None)
            return resp
        except BaseException:
            task.cancel()
            raise
        rest = text.finish(a.message.text)
        if rest:
            await resp.write(oc.sse(oc.chunk(cid, model, created, {"content": rest})))
        if a.message.tool_calls:
            calls = [oc.tool_call_json(tc, i) for i, tc in enumerate(a.message.tool_calls)]
            await resp.write(oc.sse(oc.chunk(cid, model, created, {"tool_calls": calls})))
        lp = s.logprobs(a.completion, req.top_logprobs) if req.logprobs else None
        finish = oc.finish_reason(a.reason, a.message)
        await resp.write(oc.sse(oc.chunk(cid, model, created, {}, finish=finish, logprobs=lp)))
        use = oc.usage(a.prompt_len, len(a.completion.output_ids))
        if req.include_usage:
            await resp.write(oc.sse(oc.usage_chunk(cid, model, created, use)))
        await resp.write(oc.sse("[DONE]"))
        s.record(logged, s.body(req, a, id=cid), 200, t0, a)
        return resp
