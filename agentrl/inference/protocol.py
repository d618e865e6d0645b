"""The token-exact generate contract shared by every backend.

    input_ids + SamplingParams --HTTP /generate--> output_ids + per-token logprobs
                                                   + finish_reason + weight_version

The wire format is SGLang's native ``/generate`` (see ``agentrl/inference/wire.py``); this
module holds the in-process types the rest of agentrl codes against, so nothing outside
``agentrl/inference/`` knows which backend served a token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]

DEFAULT_MAX_BATCH_SIZE = 64
"""Most requests a server decodes together unless told otherwise: ``inference.max_batch_size``,
``agentrl serve --max-batch-size``, vLLM's ``--max-num-seqs`` (the one place this default lives)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingParams:
    """How to sample one completion. Field names follow SGLang's ``sampling_params``."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    """Keep sampling past the model's EOS (benchmarks; an agent's ``ignore_eos``)."""
    stop: tuple[str, ...] = ()
    """Stop strings (the gateway passes an agent's ``stop``). SGLang and the embedded server
    stop on them (the ids keep the tokens that hold the string); vLLM's token mode cannot, and
    the gateway cuts the reply's text at the string instead."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    """What a server generated, exactly: never re-tokenized."""

    output_ids: list[int]  # [C]
    output_logprobs: list[float]  # [C], logprob of each sampled token under the serving weights
    finish_reason: FinishReason
    weight_version: int
    prompt_tokens: int
    cached_tokens: int = 0
    server: str = ""  # which server answered (for sticky routing and metrics)
    latency_s: float = 0.0
    output_versions: list[int] = field(default_factory=list)  # [C]; empty: all weight_version


@runtime_checkable
class Generator(Protocol):
    """Anything that turns prompt token ids into a Completion (the InferenceClient, a fake in tests)."""

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> Completion: ...


@runtime_checkable
class StreamingGenerator(Protocol):
    """A Generator that can also hand out tokens as they are sampled (the gateway streams them).

    ``generate_stream`` yields lists of new token ids as they arrive, then exactly one
    ``Completion`` (the whole completion, as ``generate`` returns it) last.
    """

    def generate_stream(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> AsyncIterator[list[int] | Completion]: ...
