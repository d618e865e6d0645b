"""The Dialect interface: one backend's generate request, its answer and its control calls.

    generate (hot path): request_body(ids, sampling, return_logprob) -> bytes
                         POST url + generate_path -> completion(json, url, latency) -> Completion
    control (cold path): pause / resume / abort_all / load_from_disk / weight_version,
                         each one async call against one server with a shared httpx2 client

Dialects hold no connection state; the client owns the ``httpx2.AsyncClient`` and passes it in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import httpx2

from agentrl.errors import InferenceError
from agentrl.inference.protocol import Completion, SamplingParams

PauseMode = Literal["abort", "in_place", "retract"]


class Dialect(ABC):
    """How the client talks to one kind of inference server. Subclass per backend."""

    name: ClassVar[str]
    generate_path: ClassVar[str]

    @abstractmethod
    def request_body(
        self, input_ids: list[int], sampling: SamplingParams, return_logprob: bool
    ) -> bytes:
        """The JSON body of one generate request (token ids in)."""

    def stream_body(
        self, input_ids: list[int], sampling: SamplingParams, return_logprob: bool
    ) -> bytes | None:
        """The body of a streamed generate request; None: this backend's generate does not
        stream in token mode (the client then answers in one piece)."""
        return None

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
