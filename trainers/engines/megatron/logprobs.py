"""Per-token logprobs and entropy from a vocabulary-parallel output layer, chunked over tokens.

    hidden (M, H) x weight slice (V / tp, H) -> fp32 logits slice per chunk
        -> max / sum-exp / target logit all-reduced over the tensor-parallel group
        -> logprob (M,), entropy (M,)

Each rank holds a contiguous slice of the (padded) vocabulary. The softmax normaliser is built
from an all-reduced max and an all-reduced sum of exponentials, the target's logit from the
one rank that holds it; padded vocabulary rows are masked to -inf. The reductions go through
Megatron's ``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity
backward), so every rank's gradient is the gradient of its own slice; the hidden states enter
through ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce backward), so
the layers below get the gradient of the whole vocabulary on every rank. A chunk's fp32 logits
exist only inside that chunk and are recomputed in backward (activation checkpointing).

With ``compile_backend`` set (the engine sets it with ``compile_layers`` and one TP rank), each
chunk runs as one ``torch.compile``d graph, its checkpoint included: the projection plus a few
fused kernels instead of ~15 small ones forward and again in backward, whose launch cost kept
the GPU waiting at the end of the forward and the start of the backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from agentrl.errors import ConfigError

_COMPILED: dict[tuple[str, bool], Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    true_vocab: int,
    tp_rank: int,
    tp_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    local_v = weight.shape[0]
    start = tp_rank * local_v
    logits = F.linear(hidden, weight).float() / temperature  # (n, V / tp)
    padded = torch.arange(start, start + local_v, device=logits.device) >= true_vocab
    logits = logits.masked_fill(padded, float("-inf"))
    peak = logits.detach().amax(-1)
    if tp_size > 1:
        group = parallel_state.get_tensor_model_parallel_group()
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX, group=group)
    exp = torch.exp(logits - peak.unsqueeze(-1))
    mine = (targets >= start) & (targets < start + local_v)
    picked = logits.gather(-1, (targets - start).clamp(0, local_v - 1).unsqueeze(-1)).squeeze(-1)
    picked = torch.where(mine, picked, torch.zeros_like(picked))
    sum_exp = exp.sum(-1)
    weighted = (exp * logits.masked_fill(padded, 0.0)).sum(-1) if with_entropy else sum_exp
    if tp_size > 1:
        stacked = reduce_from_tensor_model_parallel_region(torch.stack([sum_exp, picked, weighted]))
        sum_exp, picked, weighted = stacked.unbind(0)
    lse = peak + torch.log(sum_exp)
    logp = picked - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    return logp, lse - weighted / sum_exp


def _checkpointed_chunk(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    # a chunk draws no random numbers: no RNG state to save and restore
    out: tuple[torch.Tensor, torch.Tensor] = checkpoint(
        _chunk, *args, use_reentrant=False, preserve_rng_state=False
    )
    return out


def _chunk_fn(grad: bool, compile_backend: str | None) -> Callable[..., Any]:
    """The chunk function to call: checkpointed when training, compiled when asked."""
    fn = _checkpointed_chunk if grad else _chunk
    if compile_backend is None:
        return fn
    key = (compile_backend, grad)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, backend=compile_backend)
    return _COMPILED[key]


def vocab_parallel_logprobs(
    hidden_MH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_M: torch.Tensor,
    *,
    true_vocab: int,
    tp_rank: int,
    tp_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
    compile_backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ W.T / temperature)[target] over the full vocabulary: (M,), (M,)|None.

    ``compile_backend`` (one TP rank only: the chunk's all-reduces are not traced): run each
    chunk through ``torch.compile`` with this backend.
    """
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    if compile_backend is not None and tp_size > 1:
        raise ConfigError("compiled logprob chunks need tensor_parallel_size 1")
    grad = torch.is_grad_enabled() and (hidden_MH.requires_grad or weight_VH.requires_grad)
    if grad and tp_size > 1:
        # hidden is replicated over the TP group but each rank projects it onto its own vocab
        # slice: its gradient is the sum of every rank's part (identity forward, all-reduce back)
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

        hidden_MH = copy_to_tensor_model_parallel_region(hidden_MH)
    run = _chunk_fn(grad, compile_backend)
    logps, ents = [], []
    for s in range(0, hidden_MH.shape[0], chunk_tokens):
        args = (
            hidden_MH[s : s + chunk_tokens],
            weight_VH,
            targets_M[s : s + chunk_tokens],
            temperature,
            with_entropy,
            true_vocab,
            tp_rank,
            tp_size,
        )
        lp, ent = run(*args)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = hidden_MH.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)
