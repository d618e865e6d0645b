"""OpenAI Chat Completions in one place: request parsing, reply parsing, response bodies.

    body bytes --parse_chat_request--> ChatRequest --request_messages--> [Message]
    completion text --reply_message (agentrl.tool_parsers)--> assistant Message (+ ToolCalls)
    Message + token ids/logprobs --chat_completion / chunk--> JSON (or SSE ``data:`` lines)

The embedded server's ``/v1/chat/completions`` (``agentrl.inference.openai_api``) and the
recording gateway (``agentrl.gateway``) both answer with these functions, so a client sees the
same fields, finish reasons, tool-call shapes and error objects from either. Errors are
``OpenAIError``: an HTTP status and OpenAI's ``{"error": {"message", "type", "param",
"code"}}``. ``n > 1`` is refused (one trajectory records one sample per request; ask for
several requests instead). Only Chat Completions is implemented; the Responses API is not.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.tool_parsers import ToolParser
from agentrl.types import JSON, Message


class OpenAIError(Exception):
    """An error answered as OpenAI's error object with an HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> JSON:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class ChatRequest(BaseModel):
    """The fields of a Chat Completions request agentrl reads (others are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int = -1
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(s for s in self.stop if s)

    @property
    def limit(self) -> int | None:
        """The completion token limit the client asked for (None: up to the context)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


def parse_chat_request(raw: bytes | Any) -> ChatRequest:
    """Validate a request body (bytes, or its already decoded JSON); raises ``OpenAIError``
    naming the bad parameter."""
    data = raw
    if isinstance(raw, bytes | bytearray):
        try:
            data = json.loads(raw or b"null")
        except ValueError as e:
            raise OpenAIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise OpenAIError("the request body must be a JSON object with 'model' and 'messages'")
    try:
        req = ChatRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        raise OpenAIError(f"{param}: {err.get('msg')}", param=param) from None
    if req.n != 1:
        raise OpenAIError(
            f"n={req.n} is not supported: each request records one sample of a trajectory; "
            "send n=1 (several requests for several samples).",
            param="n",
        )
    if not req.messages:
        raise OpenAIError("messages is empty; send at least one message", param="messages")
    return req


_ROLES = ("system", "developer", "user", "assistant", "tool")


def request_messages(req: ChatRequest, start: int = 0) -> list[Message]:
    """The request's messages (from index ``start``) as agentrl ``Message``s (``developer``
    becomes ``system``)."""
    out = []
    for i, m in enumerate(req.messages[start:], start):
        role = m.get("role")
        if role not in _ROLES:
            raise OpenAIError(
                f"messages[{i}].role is {role!r}; expected one of {', '.join(_ROLES)}",
                param=f"messages.{i}.role",
            )
        if role == "developer":
            m = {**m, "role": "system"}
        try:
            out.append(Message.from_openai(m))
        except (KeyError, TypeError, ValueError) as e:
            raise OpenAIError(
                f"messages[{i}] is malformed ({type(e).__name__}: {e}); tool_calls need "
                "function.name and JSON function.arguments",
                param=f"messages.{i}",
            ) from None
    return out


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string (and whether one was found)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def reply_message(
    text: str, finish_reason: str, parser: ToolParser | None, tools_on: bool
) -> tuple[Message, list[str]]:
    """The assistant message for completion text: tool calls split out by ``parser``.

    A call that fails to parse leaves the whole text in the content (the agent sees what the
    model wrote) and is returned as an error string.
    """
    if parser is None or not tools_on:
        return Message(role="assistant", content=text), []
    parsed = parser.parse(text, finish_reason)
    content = text.strip() if parsed.errors else parsed.content
    return (
        Message(role="assistant", content=content, tool_calls=tuple(parsed.tool_calls)),
        list(parsed.errors),
    )


def message_json(m: Message) -> JSON:
    """An assistant message as OpenAI returns it (arguments as a JSON string)."""
    d: JSON = {"role": "assistant", "content": (m.text or None) if m.tool_calls else m.text}
    if m.tool_calls:
        d["tool_calls"] = [tool_call_json(tc) for tc in m.tool_calls]
    return d


def tool_call_json(tc: Any, index: int | None = None) -> JSON:
    d: JSON = {
        "id": tc.id,
        "type": "function",
        "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
    }
    if index is not None:
        d["index"] = index
    return d


def finish_reason(reason: str, m: Message) -> str:
    """OpenAI's finish reason: ``tool_calls`` for a reply with calls that stopped normally."""
    return "tool_calls" if m.tool_calls and reason == "stop" else reason


def logprobs_json(
    decode: Callable[[list[int]], str],
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[float, int]]] | None = None,
) -> JSON:
    """``choice.logprobs`` (``content``: one entry per sampled token)."""
    rows = top if top is not None else [() for _ in ids]
    return {
        "content": [
            {
                "token": decode([t]),
                "logprob": lp,
                "bytes": list(decode([t]).encode()),
                "top_logprobs": [
                    {"token": decode([a]), "logprob": alp, "bytes": list(decode([a]).encode())}
                    for alp, a in row
                ],
            }
            for t, lp, row in zip(ids, logprobs, rows, strict=True)
        ]
    }


def usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_completion(
    model: str, choices: list[JSON], usage_: JSON, *, id: str | None = None
) -> JSON:
    return {
        "id": id or new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def choice(
    index: int, m: Message, reason: str, *, logprobs: JSON | None = None, **extra: Any
) -> JSON:
    return {
        "index": index,
        "message": message_json(m),
        "finish_reason": finish_reason(reason, m),
        "logprobs": logprobs,
        **extra,
    }


def chunk(
    id: str,
    model: str,
    created: int,
    delta: JSON,
    *,
    finish: str | None = None,
    logprobs: JSON | None = None,
) -> JSON:
    """One ``chat.completion.chunk`` with one choice."""
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
    }


def usage_chunk(id: str, model: str, created: int, usage_: JSON) -> JSON:
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def sse(obj: JSON | str) -> bytes:
    """One server-sent event (``data: ...``); a string is sent as is (``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_list(name: str, **extra: Any) -> JSON:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agentrl", **extra}],
    }


class TextStream:
    """Turns a growing completion into content deltas that are safe to send early.

    Text is held back while it could still become part of a tool call (``hold`` markers, e.g.
    ``<tool_call>``) or a stop string, and with ``strip`` (the final content is stripped, as a
    tool parser does) surrounding whitespace too, so the text a client assembles from the
    deltas is a prefix of the final content; ``finish`` returns the rest of that content.
    """

    def __init__(
        self, hold: Sequence[str] = (), stops: Sequence[str] = (), *, strip: bool = False
    ) -> None:
        self.hold = [h for h in hold if h]
        self.strip = strip  # the final content is stripped (a tool parser strips it)
        self.stops = list(stops)
        self.sent = ""
        self._closed = False  # a marker appeared: nothing more is sent early

    def push(self, text: str) -> str:
        if self._closed:
            return ""
        cut = len(text)
        for s in (*self.hold, *self.stops):
            i = text.find(s)
            if i >= 0:
                cut, self._closed = min(cut, i), True
        if not self._closed:  # a marker could be starting at the end
            tail = max((len(s) - 1 for s in (*self.hold, *self.stops)), default=0)
            cut = max(0, cut - tail)
        safe = text[:cut].rstrip() if self.strip else text[:cut]
        if safe.endswith("\ufffd"):  # an incomplete UTF-8 sequence
            safe = safe.rstrip("\ufffd")
        if self.strip:
            safe = safe.lstrip()
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent) :], safe
        return delta

    def finish(self, content: str) -> str:
        return content[len(self.sent) :] if content.startswith(self.sent) else ""
