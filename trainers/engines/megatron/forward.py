"""One micro-batch through the GPTModel: token plan in, per-token (logprobs, entropy) out.

    TrainBatch micro-batch -> plan_scoring (padded (b, t) or packed (1, N) + THD PackedSeqParams)
        -> GPTModel(..., output_processor=score_hidden)
        -> final hidden states (s, b, H) -> rows that predict a real token
        -> vocab_parallel_logprobs -> scattered to (B, T) (0 at column 0 and padding)

``forward_step`` has the signature Megatron's pipeline schedules call
(``forward_step_func(data_iterator, model) -> (output, loss_func)``); the engine binds the
scoring options and the handler that turns the output into a loss (or collects it) first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from agentrl.batch import TrainBatch
from trainers.engines.megatron.logprobs import vocab_parallel_logprobs
from trainers.engines.torch_model import ScoringPlan, plan_scoring


@dataclass(frozen=True, kw_only=True)
class Scoring:
    """How to score: the options of one compute_logprobs / forward_backward call."""

    packed: bool
    temperature: float
    with_entropy: bool
    true_vocab: int  # vocabulary size before padding
    chunk_tokens: int
    device: torch.device
    compile_backend: str | None = None  # torch.compile the logprob chunks (one TP rank only)


def score_hidden(
    *,
    hidden_states: torch.Tensor,
    output_layer: Any,
    output_weight: torch.Tensor | None,
    context: tuple[ScoringPlan, Scoring],
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTModel output processor: (logprobs (B, T), entropy (B, T), zeros unless asked)."""
    from megatron.core import parallel_state

    plan, scoring = context
    hidden = hidden_states.transpose(0, 1).reshape(-1, hidden_states.shape[-1])  # (b*s, H)
    weight = output_weight if output_weight is not None else output_layer.weight
    logp, ent = vocab_parallel_logprobs(
        hidden[plan.src],
        weight,
        plan.targets,
        true_vocab=scoring.true_vocab,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        temperature=scoring.temperature,
        with_entropy=scoring.with_entropy,
        chunk_tokens=scoring.chunk_tokens,
        compile_backend=scoring.compile_backend,
    )
    b, t = plan.batch_shape
    rows, cols = plan.dest // t, plan.dest % t
    out = logp.new_zeros(b, t).index_put((rows, cols), logp)
    ent_bt = logp.new_zeros(b, t)
    if ent is not None:
        ent_bt = ent_bt.index_put((rows, cols), ent)
    return out, ent_bt


def forward_step(
    scoring: Scoring,
    handle: Callable[..., Any],
    data: Iterator[tuple[TrainBatch, int]],
    model: Any,
) -> tuple[Any, Callable[[Any], Any]]:
    """Run the next micro-batch; return the model output and ``handle`` bound to that batch."""
    from megatron.core.packed_seq_params import PackedSeqParams

    mb, index = next(data)
    plan = plan_scoring(mb, scoring.packed)
    packed = None
    if scoring.packed:
        cu = mb.pack().cu_seqlens.to(scoring.device)
        max_len = int(mb.seq_lens.max())
        packed = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=max_len,
            max_seqlen_kv=max_len,
        )
    out = model(
        plan.input_ids,
        plan.position_ids,
        None,
        packed_seq_params=packed,
        output_processor=score_hidden,
        output_processor_context=(plan, scoring),
    )
    return out, partial(handle, mb, index)
