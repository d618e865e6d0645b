"""The HTTP client every AgentLoop generates through: routing, failover, control, weight sync.

    generate(input_ids, SamplingParams, session_id) -> pick server (sticky per session, else
        fewest in-flight) -> POST /generate (SGLang JSON) -> Completion
        connection error / 5xx -> mark the server down, re-pin the session, try the next one
        -> every server failed -> ServerUnavailableError

Each server has a dialect (``agentrl/inference/backends/``) that builds its request and
parses its answer: SGLang's native ``/generate`` (the default; the embedded server speaks it)
or vLLM's token-in/token-out ``/inference/v1/generate`` (a ``"vllm+http://..."`` url, or
``Config.backend="vllm"``). ``generate`` goes through a pooled aiohttp session
(``agentrl/inference/transport.py``; ``Config.transport="httpx2"`` for the previous path);
control calls and weight sync go through ``self.http``, an ``httpx2.AsyncClient``. The hot path
builds and reads plain dicts (no pydantic), the dialect caches the sampling part of the body
per ``SamplingParams`` value, and routing state lives in slotted objects.

Why aiohttp (``python benchmarks/rollout_overhead.py``: each client against one loopback
server that returns a canned ``/generate`` body; 2 shared cores, two runs of 5 rounds): this
client spends 0.27-0.40 ms of CPU per request, 0.87-1.15x a raw aiohttp client's within a
round, and finishes 2,000 requests sent at once in 0.74-1.46x raw aiohttp's wall time. On
httpx2 it spent 1.57-2.33 ms per request and 24-53 s on the 2,000 (raw httpx2 alone: 1.13-2.34
ms, 18-72 s; raw aiohttp: 0.27-0.45 ms, 2.0-10.0 s): the cost is inside httpx2.

``generate_stream`` hands out token ids as the server samples them (the gateway's streaming):
a stream that fails before its first token fails over like ``generate``; one that breaks
after tokens were handed out raises ``StreamBrokenError`` (the caller has seen those tokens,
so it is not retried). Its ``cut`` stops one request early by rid (the gateway's stop
strings, on every backend).

Outcomes: an aborted request (``/abort_request``, ``pause(mode="abort")``) is *returned* as a
``Completion`` with ``finish_reason="abort"`` and the tokens generated so far, so a partial
rollout can be kept or resumed; it is not raised. A 4xx (bad request) raises
``InferenceError`` with the server's message and is not retried. A timeout counts as a failed
server (it is retried elsewhere).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx2
import torch

from agentrl.errors import (
    ConfigError,
    InferenceError,
    ServerUnavailableError,
    StreamBrokenError,
)
from agentrl.http import bearer_headers
from agentrl.inference.backends import Dialect, make_dialect, split_backend_url
from agentrl.inference.backends.base import StreamAnswer, error_message
from agentrl.inference.protocol import (
    Completion,
    Cut,
    SamplingParams,
    continuation,
    cut_completion,
    join_completions,
)
from agentrl.inference.transport import TransportFailure, TransportName, make_transport
from agentrl.inference.weights import WeightsChecksum, safetensors_buckets
from agentrl.inference.wire import parse_weight_version

logger = logging.getLogger(__name__)
T = TypeVar("T")

_OCTETS = {"content-type": "application/octet-stream"}
_JSON = {"content-type": "application/json"}


class _Server:
    __slots__ = ("dialect", "down_until", "generate_url", "inflight", "url")

    def __init__(self, url: str, dialect: Dialect) -> None:
        self.url = url
        self.dialect = dialect
        self.generate_url = url + dialect.generate_path
        self.inflight = 0
        self.down_until = 0.0


class InferenceClient:
    """Routes ``generate`` calls over N inference servers; implements ``Generator``.

    Example::

        client = InferenceClient(["http://127.0.0.1:30000", "vllm+http://127.0.0.1:8000"])
        done = await client.generate(ids, SamplingParams(max_new_tokens=64), session_id="traj-7")
        await client.aclose()
    """

    supports_top_logprobs = True
    """Every dialect returns top-k alternatives (``SamplingParams.top_logprobs``)."""

    @dataclass(kw_only=True)
    class Config:
        timeout_s: float = 600.0
        """Per-request limit (a whole generation)."""
        connect_timeout_s: float = 5.0
        max_connections: int = 512
        """Open connections across all servers. Requests beyond it wait in the pool (bounded by
        ``timeout_s``) instead of opening a socket each: thousands of concurrent rollouts then
        do not flood a server's accept queue and fail over on connect timeouts."""
        down_cooldown_s: float = 10.0
        """A server that failed is skipped for new sessions this long, then tried again."""
        max_sessions: int = 1_000_000
        """Sticky-session table size; the oldest pins are forgotten past it."""
        return_logprob: bool = True
        backend: str = "sglang"
        """Dialect of urls without a ``NAME+`` prefix: sglang (also the embedded server) or vllm."""
        api_key: str = ""
        """Bearer token of servers started with ``--api-key`` ("" = $AGENTRL_INFERENCE_API_KEY)."""
        transport: TransportName = "aiohttp"
        """HTTP library of ``generate``: aiohttp (about 3x less CPU per request, see
        ``agentrl/inference/transport.py``) or httpx2. Control calls always use httpx2."""

    def __init__(
        self, urls: Sequence[str] | str, cfg: InferenceClient.Config | None = None
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ConfigError("InferenceClient needs at least one server url, got none.")
        self.cfg = cfg or InferenceClient.Config()
        dialects: dict[str, Dialect] = {}
        self._servers = []
        for raw in urls:
            name, url = split_backend_url(raw, self.cfg.backend)
            if name not in dialects:
                dialects[name] = make_dialect(name)
            self._servers.append(_Server(url, dialects[name]))
        self._sessions: dict[str, _Server] = {}
        self._all = list(self._servers)  # routable or drained, in the order given
        self._drained: set[str] = set()
        self.admissions = 0
        """How many times a drained server was put back (``admit``)."""
        self.failovers = 0
        """How many requests failed on a server and were retried on another."""
        self._interrupts = 0  # begin_interrupt() calls so far
        self._resumed = asyncio.Event()  # clear while an interrupt is under way
        self._resumed.set()
        self.resumed_requests = 0
        """Requests aborted by an interrupt that went on from their partial tokens."""
        limits = httpx2.Limits(
            max_connections=self.cfg.max_connections,
            max_keepalive_connections=self.cfg.max_connections,
        )
        timeout = httpx2.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s)
        key = self.cfg.api_key or os.environ.get("AGENTRL_INFERENCE_API_KEY", "")
        self._http = httpx2.AsyncClient(
            limits=limits, timeout=timeout, trust_env=False, headers=bearer_headers(key)
        )
        self._transport = make_transport(self.cfg.transport, self._http, self.cfg)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def backends(self) -> dict[str, str]:
        """Each server url and the name of the dialect it is spoken to in (sglang or vllm)."""
        return {s.url: s.dialect.name for s in self._servers}

    @property
    def all_backends(self) -> dict[str, str]:
        """Like ``backends``, including drained servers."""
        return {s.url: s.dialect.name for s in self._all}

    @property
    def drained(self) -> frozenset[str]:
        """Servers taken out of routing by ``drain``."""
        return frozenset(self._drained)

    def drain(self, url: str) -> None:
        """Take ``url`` out of routing: no new or sticky requests, no control calls (idempotent).

        Its sessions are unpinned, so they move to other servers."""
        server = self._server_named(url)
        server.down_until = math.inf
        if server in self._servers:
            self._servers.remove(server)
            self._sessions = {k: s for k, s in self._sessions.items() if s is not server}
        self._drained.add(url)

    def admit(self, url: str) -> None:
        """Put a drained server back into routing, in its original place."""
        server = self._server_named(url)
        server.down_until = 0.0
        self._drained.discard(url)
        self._servers[:] = [s for s in self._all if s.url not in self._drained]
        self.admissions += 1

    def _server_named(self, url: str) -> _Server:
        for s in self._all:
            if s.url == url:
                return s
        raise ConfigError(
            f"{url} is not one of this client's servers: {[s.url for s in self._all]}"
        )

    @property
    def http(self) -> httpx2.AsyncClient:
        """The pooled HTTP client (for backend-specific control calls such as weight sync)."""
        return self._http

    # ---- generate (hot path) ------------------------------------------------------------
    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion:
        if not self._resumed.is_set():  # an interrupt is under way: start after it
            await self._resumed.wait()
        interrupts = self._interrupts
        done = await self._generate_once(input_ids, sampling, session_id, images)
        # aborted by an interrupt (a pause around a weight update): go on from its partial
        # tokens once the interrupt ends, as one completion whose tokens span the versions
        while done.finish_reason == "abort" and (
            self._interrupts > interrupts or not self._resumed.is_set()
        ):
            await self._resumed.wait()
            interrupts = self._interrupts
            left = sampling.max_new_tokens - len(done.output_ids)
            if left <= 0:
                done = dataclasses.replace(done, finish_reason="length")
                break
            more = await self._generate_once(
                input_ids + done.output_ids,
                continuation(sampling, left, len(done.output_ids)),
                session_id,
                images,
            )
            self.resumed_requests += 1
            done = join_completions(done, more)
        return done

    def begin_interrupt(self) -> None:
        """From now until ``end_interrupt``, a request answered with finish_reason "abort" is
        not returned: it waits for ``end_interrupt`` and then asks for the rest of its tokens,
        with the tokens it got appended to its prompt (and the same session, so the same server
        where it can). The caller then pauses the servers with ``pause("abort")``, updates the
        weights, ``resume``s them and calls ``end_interrupt``. An abort that began before the
        interrupt, or for another reason while none is under way, is returned as before."""
        self._interrupts += 1
        self._resumed.clear()

    def end_interrupt(self) -> None:
        """Let the requests aborted by the interrupt go on (see ``begin_interrupt``)."""
        self._resumed.set()

    async def _generate_once(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None,
        images: Sequence[str],
    ) -> Completion:
        server = self._pick(session_id)
        tried: list[_Server] | None = None  # allocated on the first failure only
        while True:
            dialect = server.dialect
            body = dialect.request_body(input_ids, sampling, self.cfg.return_logprob, images=images)
            server.inflight += 1
            start = time.perf_counter()
            try:
                status, content = await self._transport.post(server.generate_url, body)
            except TransportFailure as exc:
                problem = str(exc)
            else:
                if status == 200:
                    return dialect.completion(
                        json.loads(content), server.url, time.perf_counter() - start
                    )
                message = error_message(httpx2.Response(status, content=content))
                if status < 500:
                    raise InferenceError(f"{server.url} refused the request ({status}): {message}")
                problem = f"HTTP {status}: {message}"
            finally:
                server.inflight -= 1
            tried = [server] if tried is None else [*tried, server]
            server = self._failover(server, tried, session_id, problem)

    async def generate_stream(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        cut: Cut | None = None,
    ) -> AsyncIterator[list[int] | Completion]:
        """``generate``, with the new token ids handed out as the server samples them, then
        the Completion (``StreamingGenerator``).

        ``cut(ids_so_far)`` returning n aborts the request on its server (``/abort_request``
        by rid) and the Completion holds exactly the first n tokens, ``finish_reason="stop"``.
        A request that fails before its first token fails over like ``generate`` (sticky
        re-pin); one that breaks after tokens were handed out raises ``StreamBrokenError``
        with those tokens (never retried: the caller has seen them).
        """
        server = self._pick(session_id)
        tried: list[_Server] | None = None
        while True:
            dialect = server.dialect
            rid = uuid.uuid4().hex
            body = dialect.stream_body(input_ids, sampling, self.cfg.return_logprob, rid)
            if body is None:  # this backend answers in one piece
                c = await self.generate(input_ids, sampling, session_id=session_id)
                n = cut(c.output_ids) if cut is not None else None
                c = c if n is None else cut_completion(c, n)
                yield list(c.output_ids)
                yield c
                return
            answer = StreamAnswer()
            state: list[int | None] = [None]  # where cut() ended the answer
            start = time.perf_counter()
            server.inflight += 1
            try:
                async for new in self._stream(server, body, answer, rid, cut, state):
                    yield new
                problem = None
            except _Retry as e:
                problem = str(e)
            finally:
                server.inflight -= 1
            if problem is None:
                done = dialect.stream_completion(answer, server.url, time.perf_counter() - start)
                if done is not None:
                    yield done if state[0] is None else cut_completion(done, state[0])
                    return
                if answer.ids:
                    raise StreamBrokenError(
                        f"{server.url} ended the stream after {len(answer.ids)} tokens without "
                        "finishing the answer",
                        answer.ids,
                    )
                problem = "the stream ended without an answer"
            tried = [server] if tried is None else [*tried, server]
            server = self._failover(server, tried, session_id, problem)

    async def _stream(
        self,
        server: _Server,
        body: bytes,
        answer: StreamAnswer,
        rid: str,
        cut: Cut | None,
        state: list[int | None],
    ) -> AsyncIterator[list[int]]:
        """One streamed attempt: yields new ids; ``_Retry`` when nothing came and another
        server may take the request; ``StreamBrokenError`` when it broke after tokens."""
        dialect = server.dialect
        try:
            async with self._http.stream(
                "POST", server.generate_url, content=body, headers=_JSON
            ) as r:
                if r.status_code != 200:
                    resp = httpx2.Response(r.status_code, content=await r.aread())
                    message = error_message(resp)
                    if r.status_code < 500:
                        raise InferenceError(
                            f"{server.url} refused the streamed request ({r.status_code}): "
                            f"{message}"
                        )
                    raise _Retry(f"HTTP {r.status_code}: {message}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise _Retry(f"the server failed the stream: {error_text(event)}")
                    new = dialect.stream_event(event, answer)
                    if not new or state[0] is not None:
                        continue
                    yield list(new)
                    n = cut(answer.ids) if cut is not None else None
                    if n is not None:
                        state[0] = n
                        try:
                            await dialect.abort(self._http, server.url, rid)
                        except InferenceError as e:  # it runs to its own end instead
                            logger.warning("could not abort %s on %s: %s", rid, server.url, e)
        except (httpx2.HTTPError, _Retry) as e:
            problem = str(e) if isinstance(e, _Retry) else f"{type(e).__name__}: {e}"
            if answer.ids:
                raise StreamBrokenError(
                    f"{server.url}: the stream broke after {len(answer.ids)} tokens ({problem}); "
                    "the partial answer is not retried",
                    answer.ids,
                ) from e
            raise _Retry(problem) from e

    def _pick(self, session_id: str | None) -> _Server:
        if session_id is not None:
            pinned = self._sessions.get(session_id)
            if pinned is not None and pinned.down_until <= time.monotonic():
                return pinned
        servers = self._servers
        if len(servers) == 1:
            best = servers[0]
        else:
            now = time.monotonic()
            up = [s for s in servers if s.down_until <= now] or servers
            best = min(up, key=_load)
        if session_id is not None:
            self._pin(session_id, best)
        return best

    def _pin(self, session_id: str, server: _Server) -> None:
        sessions = self._sessions
        if session_id not in sessions and len(sessions) >= self.cfg.max_sessions:
            del sessions[next(iter(sessions))]
        sessions[session_id] = server

    def _failover(
        self, failed: _Server, tried: list[_Server], session_id: str | None, problem: str
    ) -> _Server:
        failed.down_until = time.monotonic() + self.cfg.down_cooldown_s
        logger.warning("inference server %s failed (%s); failing over", failed.url, problem)
        left = [s for s in self._servers if s not in tried]
        if not left:
            raise ServerUnavailableError(
                f"all {len(self._servers)} inference servers failed; last: {failed.url}: {problem}. "
                "Check that the servers are running (GET /health) and reachable."
            )
        self.failovers += 1
        now = time.monotonic()
        nxt = min(left, key=lambda s: (s.down_until > now, s.inflight))
        if session_id is not None:
            self._pin(session_id, nxt)
        return nxt

    def release(self, session_id: str) -> None:
        """Forget a finished trajectory's pin."""
        self._sessions.pop(session_id, None)

    # ---- control --------------------------------------------------------------------------
    async def _each(self, fn: Callable[[_Server], Awaitable[T]]) -> dict[str, T]:
        """Run ``fn`` for every server concurrently; InferenceError naming each one that failed."""
        out = await asyncio.gather(*(fn(s) for s in self._servers), return_exceptions=True)
        errors = [
            f"{s.url}: {o}"
            for s, o in zip(self._servers, out, strict=True)
            if isinstance(o, BaseException)
        ]
        if errors:
            raise InferenceError("; ".join(errors))
        return {s.url: o for s, o in zip(self._servers, out, strict=True)}  # type: ignore[misc]

    def _require(self, dialect: str, what: str) -> None:
        other = next((s for s in self._servers if s.dialect.name != dialect), None)
        if other is not None:
            raise ConfigError(
                f"{what} is a {dialect} endpoint, but {other.url} is a {other.dialect.name} "
                "server; use agentrl.inference.weight_sync (DiskWeightSync or VLLMWeightSync) there."
            )

    async def _post_all(self, path: str, **kw: Any) -> dict[str, Any]:
        """POST to every server concurrently; InferenceError naming each one that failed."""

        async def one(s: _Server) -> Any:
            try:
                resp = await self._http.post(s.url + path, **kw)
            except httpx2.TransportError as exc:
                return InferenceError(f"{s.url}{path}: {type(exc).__name__}: {exc}")
            if resp.status_code != 200:
                return InferenceError(f"{s.url}{path} -> {resp.status_code}: {error_message(resp)}")
            return resp.json()

        out = await asyncio.gather(*(one(s) for s in self._servers))
        errors = [str(o) for o in out if isinstance(o, Exception)]
        if errors:
            raise InferenceError("; ".join(errors))
        return {s.url: o for s, o in zip(self._servers, out, strict=True)}

    async def pause(self, mode: Literal["abort", "in_place", "retract"] = "abort") -> None:
        """Stop generation on every server. ``abort`` returns in-flight requests now with
        finish_reason "abort"; ``in_place`` keeps them waiting until ``resume()``."""
        await self._each(lambda s: s.dialect.pause(self._http, s.url, mode))

    async def resume(self) -> None:
        await self._each(lambda s: s.dialect.resume(self._http, s.url))

    async def abort_all(self) -> None:
        await self._each(lambda s: s.dialect.abort_all(self._http, s.url))

    async def weight_versions(self) -> dict[str, int]:
        """Each server's current weight version."""
        return await self._each(lambda s: s.dialect.weight_version(self._http, s.url))

    async def health(self, timeout_s: float = 5.0) -> dict[str, bool]:
        async def one(s: _Server) -> bool:
            try:
                return (
                    await self._http.get(s.url + "/health", timeout=timeout_s)
                ).status_code == 200
            except httpx2.HTTPError:
                return False

        ok = await asyncio.gather(*(one(s) for s in self._servers))
        return dict(zip(self.urls, ok, strict=True))

    async def update_weights_from_disk(
        self, path: str, version: int | None = None
    ) -> dict[str, int]:
        """Every server loads an HF dir; returns each server's new weight version."""
        return await self._each(
            lambda s: s.dialect.load_from_disk(self._http, s.url, str(path), version)
        )

    async def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        *,
        bucket_bytes: int = 256 << 20,
    ) -> dict[str, int]:
        """Send tensors as safetensors buckets (staged), then one flush that applies them all
        between decode steps and sets ``version`` (or bumps it). Returns each server's version."""
        self._require("sglang", "/update_weights_from_tensor")
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        for blob in safetensors_buckets(items, bucket_bytes):
            await self._post_all(
                "/update_weights_from_tensor", content=blob, headers=_OCTETS, params={"flush": "0"}
            )
        params = (
            {"flush": "1"} if version is None else {"flush": "1", "weight_version": str(version)}
        )
        out = await self._post_all(
            "/update_weights_from_tensor", content=b"", headers=_OCTETS, params=params
        )
        return {u: parse_weight_version(r.get("weight_version")) for u, r in out.items()}

    async def weights_checksum(self, per_tensor: bool = True) -> dict[str, WeightsChecksum]:
        """Each server's weight checksums (compare with ``weights.checksum_named_tensors``)."""
        self._require("sglang", "/weights_checksum")

        async def one(s: _Server) -> WeightsChecksum:
            resp = await self._http.get(
                s.url + "/weights_checksum", params={"per_tensor": int(per_tensor)}
            )
            if resp.status_code != 200:
                raise InferenceError(
                    f"{s.url}/weights_checksum -> {resp.status_code}: {error_message(resp)}"
                )
            d = resp.json()
            return WeightsChecksum(
                overall=d["checksum"],
                tensors=d.get("tensors", {}),
                dtype=d.get("dtype", ""),
                weight_version=parse_weight_version(d.get("weight_version")),
            )

        sums = await asyncio.gather(*(one(s) for s in self._servers))
        return dict(zip(self.urls, sums, strict=True))

    async def aclose(self) -> None:
        await self._transport.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _load(s: _Server) -> int:
    return s.inflight


class _Retry(Exception):
    """A streamed attempt failed before its first token: another server may take it."""


def error_text(event: dict[str, Any]) -> str:
    err = event.get("error")
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)
