"""The token-exact generate contract shared by every backend.

    input_ids + SamplingParams --HTTP /generate--> output_ids + per-token logprobs
                                                   + finish_reason + weight_version

The wire format is SGLang's native ``/generate`` (see ``agentrl/inference/wire.py``); this
module holds the in-process types the rest of agentrl codes against, so nothing outside
``agentrl/inference/`` knows which backend served a token, and the two functions that carry a
request across an interrupting weight update (``continuation``, ``join_completions``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
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
    """Stop strings, for servers that detokenize (SGLang and the embedded server stop on them;
    the ids keep the tokens that hold the string). vLLM's token mode cannot; the gateway does
    not send them but cuts the stream itself (``StreamingGenerator.generate_stream(cut=...)``),
    which works on every backend."""
    top_logprobs: int = 0
    """Also return the ``top_logprobs`` most likely tokens at each position
    (``Completion.output_top_logprobs``); 0: only the sampled token's logprob."""


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
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    """Per output token, its k best (logprob, token id), most likely first, when
    ``SamplingParams.top_logprobs`` > 0."""


@runtime_checkable
class Generator(Protocol):
    """Anything that turns prompt token ids into a Completion (the InferenceClient, a fake in tests).

    ``images`` (a vision-language model's prompt) are the data URLs of the images whose
    placeholder tokens ``input_ids`` hold, in placeholder order (``agentrl.vision``); callers
    pass it only when there are images, so a text-only generator may leave it out.
    """

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion: ...


Cut = Callable[[list[int]], "int | None"]
"""Called with the output ids so far; a number n ends the request after its first n tokens."""


@runtime_checkable
class StreamingGenerator(Protocol):
    """A Generator that can also hand out tokens as they are sampled (the gateway streams them).

    ``generate_stream`` yields lists of new token ids as they arrive, then exactly one
    ``Completion`` (the whole completion, as ``generate`` returns it) last. With ``cut``, it
    is called after each arrival with all the ids so far; when it returns n, the request is
    stopped on the server and the Completion holds exactly the first n sampled tokens (with
    their logprobs and versions) and ``finish_reason="stop"`` (the gateway's stop strings).
    """

    def generate_stream(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        cut: Cut | None = None,
    ) -> AsyncIterator[list[int] | Completion]: ...


def cut_completion(c: Completion, n: int) -> Completion:
    """``c`` ending after its first ``n`` tokens, stopped (a stop string ended there)."""
    top = c.output_top_logprobs
    return dataclasses.replace(
        c,
        output_ids=c.output_ids[:n],
        output_logprobs=c.output_logprobs[:n],
        output_versions=c.output_versions[:n],
        output_top_logprobs=top[:n] if top is not None else None,
        finish_reason="stop",
    )


def continuation(sampling: SamplingParams, left: int, done: int) -> SamplingParams:
    """The sampling of the rest of a request interrupted after ``done`` tokens: ``left`` more
    tokens, and a seed of its own (a seeded request would otherwise draw its first random
    numbers again)."""
    seed = sampling.seed
    if seed is not None:
        digest = hashlib.blake2b(f"{seed}|{done}".encode(), digest_size=8).digest()
        seed = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    return dataclasses.replace(sampling, max_new_tokens=left, seed=seed)


def join_completions(first: Completion, rest: Completion) -> Completion:
    """``first`` (interrupted) followed by ``rest``: one completion whose per-token versions
    say which weights made each token."""
    versions = first.output_versions or [first.weight_version] * len(first.output_ids)
    more = rest.output_versions or [rest.weight_version] * len(rest.output_ids)
    top = None
    if first.output_top_logprobs is not None and rest.output_top_logprobs is not None:
        top = first.output_top_logprobs + rest.output_top_logprobs
    return dataclasses.replace(
        rest,
        output_ids=first.output_ids + rest.output_ids,
        output_logprobs=first.output_logprobs + rest.output_logprobs,
        output_versions=versions + more,
        output_top_logprobs=top,
        prompt_tokens=first.prompt_tokens,
        cached_tokens=first.cached_tokens,
        latency_s=first.latency_s + rest.latency_s,
    )
