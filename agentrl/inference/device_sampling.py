"""Next-token sampling on the device, for the static engine: no per-row host work, no sync.

    logits (B, V) + per-row temperature, top_p, top_k, seed, draw index (B,) tensors
        -> log_softmax(logits / T) -> [top-k / top-p filter] -> inverse-CDF draw
        -> tokens (B,), logprob of each under log_softmax(logits / T) (B,)

Same contract as ``sampling.py``: the reported logprob is the unfiltered tempered
log-softmax of the sampled token (``T == 0``: greedy on the raw logits), top-k/top-p only
decide which token is drawn. The uniform number of a draw is a hash of the request's seed and
the index of the token in its request (a counter-based generator), not a ``torch.Generator``
per row: a seeded request draws the same numbers whatever its batch, device or timing, and
the whole batch draws in a few vectorized ops that a CUDA graph could hold.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (lowbias32) on int64 tensors; products wrap, low bits are exact."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """One uniform number in [0, 1) per row (float32, 24 bits) from (seed, draw index), int64."""
    h = _hash32(draws + 0x9E3779B9)
    h = _hash32(h ^ ((seeds >> 32) & _M32))
    h = _hash32(h ^ (seeds & _M32))
    return (h >> 8).float() * (1.0 / (1 << 24))


def sample_on_device(
    logits: torch.Tensor,  # (B, V)
    temperature: torch.Tensor,  # (B,) float32; <= 0 is greedy
    top_p: torch.Tensor,  # (B,) float32
    top_k: torch.Tensor,  # (B,) int64; V (or more) keeps every token
    seeds: torch.Tensor,  # (B,) int64
    draws: torch.Tensor,  # (B,) int64, the index of this token in its request
    filtering: bool,  # some row has top_k < V or top_p < 1 (known on the host)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens (B,), their logprobs (B,) and the tempered log-softmax (B, V)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = temperature <= 0.0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)  # (B, V)
    probs = logp.exp()
    order = None
    if filtering:
        probs, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        keep = ranks < top_k[:, None]
        keep &= (probs.cumsum(dim=-1) - probs) < top_p[:, None]  # mass strictly before
        probs = probs * keep
        n_keep = keep.sum(dim=-1)
    else:
        n_keep = torch.full_like(top_k, vocab)
    cdf = probs.cumsum(dim=-1)  # (B, V)
    target = uniforms(seeds, draws) * cdf[:, -1]
    pos = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
    pos = torch.minimum(pos, n_keep - 1)
    drawn = pos if order is None else order.gather(1, pos[:, None])[:, 0]
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)
    return tokens, logp.gather(1, tokens[:, None])[:, 0], logp
