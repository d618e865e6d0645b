"""The HTTP wire format: SGLang's native ``/generate`` request and response, field for field.

    client dict --JSON--> GenerateRequest (validated here, server side) -> engine
    engine result -> generate_response() dict --JSON--> client (parsed as a plain dict)

The models mirror SGLang's ``GenerateReqInput`` / ``SamplingParams`` and the ``meta_info`` its
``/generate`` returns, so a client written for SGLang talks to the embedded server unchanged and
the agentrl client talks to a real SGLang server unchanged. Fields SGLang accepts but the
embedded server cannot honour (penalties, grammars, LoRA, images) are declared so a request
carrying their *default* values passes, and a non-default value gets a 400 naming the field.

Extensions (both directions stay SGLang-compatible):
- ``meta_info.weight_version`` is an integer counter here (SGLang sends a string, often
  ``"default"``); clients accept both through ``parse_weight_version``.
- ``meta_info.output_token_weight_versions`` (``[C]`` ints) appears only when the weights
  changed while the request was running, so the trainer knows which version made each token.
- ``sampling_params.seed`` is an alias of SGLang's ``sampling_seed``.

The response side is described by pydantic models for documentation and tests, but the
server builds plain dicts (``generate_response``) and the client reads plain dicts: the hot
path pays for no validation it does not need.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Sampling fields SGLang accepts that the embedded server does not implement, with the value
# that means "off". A request may send them at that value; anything else is refused.
UNSUPPORTED_AT_DEFAULT: dict[str, object] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "custom_params": None,
    "logit_bias": None,
}


class WireSamplingParams(BaseModel):
    """SGLang ``sampling_params``. Unknown keys are refused (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    seed: int | None = None  # extension: alias of sampling_seed
    stream_interval: int | None = None
    # Accepted only at their "off" value (see UNSUPPORTED_AT_DEFAULT).
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stop_regex: str | list[str] | None = None
    custom_params: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[str]:
        """Names of fields set to a value the embedded server cannot honour."""
        return [k for k, off in UNSUPPORTED_AT_DEFAULT.items() if getattr(self, k) != off]

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(s for s in self.stop if s)


class GenerateRequest(BaseModel):
    """SGLang ``GenerateReqInput`` (the subset that a text-only server can honour).

    Exactly one of ``text`` / ``input_ids``; either may be a batch (a list of prompts), in which
    case ``sampling_params`` may be one dict for all or one per prompt, and the response is a list.
    """

    model_config = ConfigDict(extra="forbid")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: WireSamplingParams | list[WireSamplingParams] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    log_metrics: bool = True
    session_id: str | None = None
    # Accepted only when empty.
    input_embeds: list[Any] | None = None
    image_data: Any = None
    lora_path: str | list[str | None] | None = None
    custom_logit_processor: str | list[str | None] | None = None
    session_params: dict[str, Any] | None = None


class FinishReason(BaseModel):
    """``meta_info.finish_reason``: ``stop`` (``matched`` = token id or stop string), ``length``
    (``length`` = the limit hit) or ``abort`` (``message`` says why)."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(BaseModel):
    """``meta_info`` of a ``/generate`` response."""

    model_config = ConfigDict(extra="allow")

    id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    e2e_latency: float = 0.0
    weight_version: int | str = 0
    # [[logprob, token_id, text_or_None], ...], present when return_logprob
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None
    output_token_weight_versions: list[int] | None = None


class GenerateResponse(BaseModel):
    """One ``/generate`` result (a batch request returns a list of these)."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


def finish_reason_dict(
    kind: str, *, matched: int | str | None = None, length: int | None = None, message: str = ""
) -> dict[str, object]:
    """SGLang's ``finish_reason`` JSON for one of stop / length / abort."""
    if kind == "stop":
        return {"type": "stop", "matched": matched}
    if kind == "length":
        return {"type": "length", "length": length}
    return {"type": "abort", "message": message}


def generate_response(
    *,
    rid: str,
    text: str,
    output_ids: list[int],
    finish_reason: dict[str, object],
    prompt_tokens: int,
    weight_version: int,
    e2e_latency: float,
    output_logprobs: list[float] | None,
    output_versions: list[int] | None = None,
    top_logprobs: list[list[tuple[float, int]]] | None = None,
) -> dict[str, object]:
    """Build a ``/generate`` response as a plain dict (no model validation on the hot path)."""
    meta: dict[str, object] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "e2e_latency": e2e_latency,
        "weight_version": weight_version,
    }
    if output_logprobs is not None:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(output_logprobs, output_ids, strict=True)
        ]
    if top_logprobs is not None:
        meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in row] for row in top_logprobs]
    if output_versions is not None:
        meta["output_token_weight_versions"] = output_versions
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def error_body(
    message: str, *, status: int = 400, kind: str = "BadRequestError"
) -> dict[str, object]:
    """The error JSON every endpoint returns (OpenAI's shape, which SGLang also uses)."""
    return {"error": {"message": message, "type": kind, "code": status}}


def parse_weight_version(value: object) -> int:
    """Our servers send an int; SGLang sends a string (``"default"`` before any update)."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return 0
