"""OpenAI-compatible endpoints of the embedded server, for black-box agents.

    /v1/chat/completions: messages (+ tools) --chat template--> token ids --engine--> text
        --agentrl.tool_parsers (hermes)--> assistant message (+ tool_calls), or SSE chunks
    /v1/completions:      prompt (text or token ids) --engine--> text
    /v1/models:           the one served model

The chat template is the tokenizer's own, rendered to text and then encoded without special
tokens (so the prompt ids are exactly the template's). ``tools`` and ``chat_template_kwargs``
are passed to the template. Chat requests and answers are parsed and built by
``agentrl.inference.openai_chat`` (shared with the recording gateway), tool calls by
``agentrl.tool_parsers`` (Hermes); ``stream=true`` sends SSE chunks as the engine samples
tokens; ``n > 1`` is refused on chat (one sample per request). ``/v1/completions`` refuses
``stream`` and ``echo`` with a 400. With
``return_token_ids: true`` (vLLM's field) each choice also carries ``prompt_token_ids`` and
``token_ids``, so a black-box agent can still keep a token-exact ledger. A vision-language
model takes image parts (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``)
in user messages: each is rendered as one placeholder, expanded to the image's token count and
sent with its pixels (``agentrl.vision``); remote image URLs are refused.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import ConfigError, TokenizationError
from agentrl.http import json_response, parse_body
from agentrl.inference.openai_chat import (
    ChatRequest,
    OpenAIError,
    TextStream,
    chat_completion,
    choice,
    chunk,
    finish_reason,
    logprobs_json,
    models_list,
    new_id,
    parse_chat_request,
    reply_message,
    request_messages,
    sse,
    tool_call_json,
    usage,
    usage_chunk,
)
from agentrl.inference.responses import error_response
from agentrl.inference.runner_types import RequestParams, RunnerResult
from agentrl.inference.wire import WireSamplingParams
from agentrl.tool_parsers import get_tool_parser
from agentrl.vision import ImageInputs, has_images, image_urls

if TYPE_CHECKING:
    from agentrl.inference.server import ServerState


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    n: int = Field(default=1, ge=1, le=64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=0)
    logprobs: int | None = None
    echo: bool = False


def add_openai_routes(app: FastAPI, state: ServerState) -> None:
    tok = state.tokenizer
    parser = get_tool_parser("hermes")

    async def run_n(req: _Common, ids: list[int], max_tokens: int, top: int) -> list[RunnerResult]:
        if req.stream:
            raise ConfigError(
                "stream=true is not supported by the embedded server; send stream=false."
            )
        state.check_prompt(ids)
        sp = WireSamplingParams(
            max_new_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
        )
        outs = []
        for i in range(req.n):
            seed = None if req.seed is None else req.seed + i
            sp_i = sp.model_copy(update={"seed": seed})
            outs.append(state.run(uuid.uuid4().hex, ids, state.request_params(sp_i, top)))
        results = await asyncio.gather(*outs)
        failed = next((r.error for r in results if r.error), None)
        if failed:
            raise RuntimeError(failed)
        return list(results)

    def text_of(res: RunnerResult, skip_special: bool) -> tuple[str, str]:
        text = str(tok.decode(res.output_ids, skip_special_tokens=skip_special))
        matched = res.finish_reason.get("matched")
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return text, str(res.finish_reason["type"])

    def usage_n(prompt: int, results: list[RunnerResult]) -> dict[str, int]:
        done = sum(len(r.output_ids) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response(
            models_list(
                state.model_name,
                root=state.engine.cfg.model,
                max_model_len=state.engine.max_context,
            )
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            req = parse_body(CompletionRequest, await request.body())
            if req.echo:
                raise ConfigError("echo=true is not supported by the embedded server.")
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
                if len(prompt) != 1:
                    raise ConfigError(
                        "send one prompt per /v1/completions call (use n for samples)."
                    )
                prompt = prompt[0]
            ids = (
                tok.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
            )
            results = await run_n(req, ids, req.max_tokens, req.logprobs or 0)  # type: ignore[arg-type]
        except ConfigError as exc:
            return error_response(str(exc))
        except RuntimeError as exc:
            return error_response(f"engine failed: {exc}", 500)
        choices = []
        for i, res in enumerate(results):
            text, reason = text_of(res, req.skip_special_tokens)
            choice: dict[str, Any] = {
                "index": i,
                "text": text,
                "finish_reason": reason,
                "logprobs": None,
            }
            if req.logprobs is not None:
                choice["logprobs"] = {
                    "tokens": tok.convert_ids_to_tokens(res.output_ids),
                    "token_logprobs": res.output_logprobs,
                    "top_logprobs": [
                        {tok.convert_ids_to_tokens(t): lp for lp, t in row}
                        for row in res.top_logprobs or []
                    ]
                    or None,
                }
            if req.return_token_ids:
                choice.update(prompt_token_ids=ids, token_ids=res.output_ids)
            choices.append(choice)
        return json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": state.model_name,
                "choices": choices,
                "usage": usage_n(len(ids), results),
            }
        )

    def chat_images(req: ChatRequest, ids: list[int]) -> tuple[list[int], ImageInputs | None]:
        """The prompt with each image's placeholder expanded, and the images' pixels."""
        vision = state.engine.vision
        try:
            if vision is None:
                if has_images(req.messages):
                    raise TokenizationError(
                        "a message has an image part but the served model is text-only; send "
                        "text only, or serve a vision-language model (agentrl.tiny."
                        "make_tiny_model(arch='qwen2_vl'))"
                    )
                return ids, None
            urls = image_urls(req.messages)
            if not urls:
                return ids, None
            return vision.expand(ids, urls), vision.pixels(urls)
        except TokenizationError as exc:
            raise OpenAIError(str(exc), param="messages") from None

    async def stream_chat(
        req: ChatRequest,
        ids: list[int],
        params: RequestParams,
        tools_on: bool,
        images: ImageInputs | None,
    ) -> AsyncIterator[bytes]:
        """SSE chunks as the engine samples tokens (shared builders: ``openai_chat``)."""
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        task = asyncio.create_task(
            state.run(uuid.uuid4().hex, ids, params, queue.put_nowait, images=images)
        )
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        cid, created, model = new_id(), int(time.time()), state.model_name
        hold = [getattr(parser, "open_tag", "")] if tools_on else []
        text = TextStream(hold=hold, stops=req.stops, strip=tools_on)
        out: list[int] = []
        try:
            yield sse(chunk(cid, model, created, {"role": "assistant", "content": ""}))
            while (tok_id := await queue.get()) is not None:
                out.append(tok_id)
                delta = text.push(str(tok.decode(out, skip_special_tokens=req.skip_special_tokens)))
                if delta:
                    yield sse(chunk(cid, model, created, {"content": delta}))
            res = await task
            if res.error:
                err = OpenAIError(f"engine failed: {res.error}", status=500, type="server_error")
                yield sse(err.body())
                yield sse("[DONE]")
                return
            content, reason = text_of(res, req.skip_special_tokens)
            message, _errors = reply_message(content, reason, parser, tools_on)
            rest = text.finish(message.text)
            if rest:
                yield sse(chunk(cid, model, created, {"content": rest}))
            if message.tool_calls:
                calls = [tool_call_json(tc, i) for i, tc in enumerate(message.tool_calls)]
                yield sse(chunk(cid, model, created, {"tool_calls": calls}))
            yield sse(chunk(cid, model, created, {}, finish=finish_reason(reason, message)))
            if req.include_usage:
                yield sse(usage_chunk(cid, model, created, usage(len(ids), len(res.output_ids))))
            yield sse("[DONE]")
        finally:
            if not task.done():  # the client went away: abort the request
                task.cancel()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            req = parse_chat_request(await request.body())
            request_messages(req)  # validates roles and tool calls
            tools: Any = None if req.tool_choice == "none" else req.tools
            try:
                rendered = tok.apply_chat_template(
                    req.messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=True,
                    **(req.chat_template_kwargs or {}),
                )
            except Exception as exc:
                raise OpenAIError(
                    f"the chat template could not render these messages: {exc}",
                    param="messages",
                ) from exc
            ids, images = chat_images(req, tok.encode(rendered, add_special_tokens=False))
            limit = req.limit
            if limit is None:
                limit = max(1, state.engine.max_context - len(ids) - 1)
            top = req.top_logprobs if req.logprobs else 0
            sp = WireSamplingParams(
                max_new_tokens=limit,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos,
                seed=req.seed,
            )
            try:
                state.check_prompt(ids)
                params = state.request_params(sp, top)
            except ConfigError as exc:
                raise OpenAIError(str(exc)) from exc
            if req.stream:
                return StreamingResponse(
                    stream_chat(req, ids, params, bool(tools), images),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            res = await state.run(uuid.uuid4().hex, ids, params, images=images)
            if res.error:
                raise OpenAIError(f"engine failed: {res.error}", status=500, type="server_error")
        except OpenAIError as exc:
            return json_response(exc.body(), status=exc.status)
        text, reason = text_of(res, req.skip_special_tokens)
        message, _errors = reply_message(text, reason, parser, bool(tools))
        extra = (
            {"prompt_token_ids": ids, "token_ids": res.output_ids} if req.return_token_ids else {}
        )
        lp = (
            logprobs_json(
                lambda t: str(tok.decode(t)), res.output_ids, res.output_logprobs, res.top_logprobs
            )
            if req.logprobs
            else None
        )
        body = chat_completion(
            state.model_name,
            [choice(0, message, reason, logprobs=lp, **extra)],
            usage(len(ids), len(res.output_ids)),
        )
        return json_response(body)
