"""The Dialect interface: one backend's generate request, its answer and its control calls.

    generate (hot path): request_body(ids, sampling, return_logprob) -> bytes
                         POST url + generate_path -> completion(json, url, latency) -> Completion
    streamed generate:   stream_body(ids, sampling, return_logprob, rid) -> bytes
                         each SSE event -> stream_event(event, StreamAnswer) -> new token ids
                         the end -> stream_completion(StreamAnswer, url, latency) -> Completion
                         abort(http, url, rid): stop that one request (the stream then ends)
    control (cold path): pause / resume / abort_all / load_from_disk / weight_version,
                         each one async call against one server with a shared httpx2 client

Dialects hold no connection state; the client owns the ``httpx2.AsyncClient`` and passes it in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import httpx2

from agentrl.errors import InferenceError
from agentrl.inference.protocol import Completion, SamplingParams

PauseMode = Literal["abort", "in_place", "retract"]


class StreamAnswer:
    """What one streamed answer has delivered so far (filled in by ``Dialect.stream_event``)."""

    __slots__ = ("final", "finish", "ids", "logprobs", "prompt_tokens", "spans", "top")

    def __init__(self) -> None:
        self.ids: list[int] = []  # [C] so far
        self.logprobs: list[float] = []  # [C] so far, where the backend streams them
        self.top: list[list[tuple[float, int]]] = []  # [C][k] so far, likewise
        self.final: dict[str, Any] | None = None  # the event that ended the answer
        self.finish: str | None = None
        self.spans: list[Any] = []  # weight-version spans (vLLM)
        self.prompt_tokens = 0


class Dialect(ABC):
    """How the client talks to one kind of inference server. Subclass per backend."""

    name: ClassVar[str]
    generate_path: ClassVar[str]

    @abstractmethod
    def request_body(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        return_logprob: bool,
        *,
        images: Sequence[str] = (),
    ) -> bytes:
        """The JSON body of one generate request (token ids in, with their images' data URLs)."""

    def stream_body(
        self, input_ids: list[int], sampling: SamplingParams, return_logprob: bool, rid: str
    ) -> bytes | None:
        """The body of a streamed generate request with request id ``rid``; None: this
        backend's generate does not stream (the client then answers in one piece)."""
        return None

    def stream_event(self, event: dict[str, Any], answer: StreamAnswer) -> list[int]:
        """Fold one SSE event into ``answer``; the token ids it added."""
        raise NotImplementedError(f"the {self.name} dialect does not stream")

    def stream_completion(
        self, answer: StreamAnswer, server: str, latency: float
    ) -> Completion | None:
        """The Completion of a finished stream (None: the stream never said it finished)."""
        raise NotImplementedError(f"the {self.name} dialect does not stream")

    async def abort(self, http: httpx2.AsyncClient, url: str, rid: str) -> None:
        """Abort one request (its stream then ends with what was sampled so far)."""
        raise NotImplementedError(f"the {self.name} dialect cannot abort one request")

    @abstractmethod
    def completion(self, data: dict[str, Any], server: str, latency: float) -> Completion:
        """Parse a 200 answer; never re-tokenizes."""

    @abstractmethod
    async def pause(self, http: httpx2.AsyncClient, url: str, mode: PauseMode) -> None:
        """Stop generating; ``abort`` returns in-flight requests now as aborted."""

    @abstractmethod
    async def resume(self, http: httpx2.AsyncClient, url: str) -> None: ...

    @abstractmethod
    async def abort_all(self, http: httpx2.AsyncClient, url: str) -> None: ...

    @abstractmethod
    async def load_from_disk(
        self, http: httpx2.AsyncClient, url: str, path: str, version: int | None
    ) -> int:
        """Reload every weight from an HF directory; returns the server's new version."""

    @abstractmethod
    async def weight_version(self, http: httpx2.AsyncClient, url: str) -> int: ...


def error_message(resp: httpx2.Response) -> str:
    """The human part of an error answer (OpenAI/SGLang/vLLM/FastAPI shapes)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if not isinstance(body, dict):
        return str(body)[:500]
    err = body.get("error")
    if isinstance(err, dict) and "message" in err:
        return str(err["message"])
    for key in ("message", "detail", "error"):
        if key in body:
            return str(body[key])[:500]
    return str(body)[:500]


async def call(
    http: httpx2.AsyncClient,
    method: str,
    url: str,
    *,
    json: object = None,
    params: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Any:
    """One control request; its JSON answer (None when empty). InferenceError naming the url,
    the status and the server's message otherwise."""
    kw: dict[str, Any] = {"params": params}
    if json is not None:
        kw["json"] = json
    if timeout is not None:
        kw["timeout"] = timeout
    try:
        resp = await http.request(method, url, **kw)
    except httpx2.TransportError as exc:
        raise InferenceError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise InferenceError(f"{method} {url} -> {resp.status_code}: {error_message(resp)}")
    return resp.json() if resp.content else None
