"""What the engine runs: a request's parameters, its progress, its result.

    server / tests -> RunnerRequest(rid, input_ids, RequestParams, on_done) -> ModelRunner.submit
    engine thread  -> appends tokens to the RunnerRequest -> on_done(RunnerResult)

Shared by both engines (``runner.py``'s dynamic ``ModelRunner``, ``static_runner.py``) and by
the server that builds requests and answers from results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.inference.sampling import RowSampling
from agentrl.vision import ImageInputs


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestParams:
    """What the engine needs to run one request (already validated by the server)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunnerResult:
    rid: str
    output_ids: list[int]  # [C]
    output_logprobs: list[float]  # [C]
    finish_reason: dict[str, object]  # SGLang finish_reason JSON
    weight_version: int
    output_versions: list[int] | None  # [C]; None when one version made every token
    prompt_tokens: int
    top_logprobs: list[list[tuple[float, int]]] | None = None
    error: str | None = None  # set when the engine failed (the server answers 500)


@dataclass(eq=False, kw_only=True)
class RunnerRequest:
    """One request and its progress. Mutated only by the engine thread."""

    rid: str
    input_ids: list[int]  # [P]
    params: RequestParams
    on_done: Callable[[RunnerResult], None]
    on_token: Callable[[int], None] | None = None  # called (engine thread) per sampled token
    images: ImageInputs | None = None  # the prompt's images (a vision-language model)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[float, int]]] = field(default_factory=list)
    version_marks: list[tuple[int, int]] = field(default_factory=list)  # (n_tokens, version)
    start_version: int = 0
    kv_epoch: int = -1  # static engine: the weights its KV was computed with (see weights_changed)
    row: RowSampling | None = None
