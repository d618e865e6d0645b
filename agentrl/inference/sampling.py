"""Next-token sampling for a batch of rows, each with its own temperature, top-k, top-p and RNG.

    logits (B, V) -> log_softmax(logits / T) -> [top-k / top-p filter] -> inverse-CDF draw
                  -> (token ids [B], logprob of each under log_softmax(logits / T) [B])

The reported logprob is the *unfiltered* ``log_softmax(logits / T)`` of the sampled token
(``T == 0`` means greedy and uses the raw logits): that is what a trainer recomputes with a
teacher-forced forward pass, so server and trainer logprobs agree. Top-k/top-p only decide
which token is drawn. Each sampled row draws one uniform number from its own
``torch.Generator`` (seeded per request), so a seeded request gives the same tokens whatever
else shares its batch, and the draw itself is vectorized over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSampling:
    """Sampling settings of one row (one request)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    top_logprobs: int = 0  # how many top alternatives to report per token
    generator: torch.Generator | None = None  # required when temperature > 0
    seed: int = 0  # the request's seed (the static engine draws from it on the device)


@dataclass(frozen=True, slots=True)
class Sampled:
    tokens: list[int]  # [B]
    logprobs: list[float]  # [B]
    top: list[list[tuple[float, int]] | None]  # [B], rows that asked for top logprobs


def sample_rows(logits: torch.Tensor, rows: list[RowSampling]) -> Sampled:
    """Pick one token per row of ``logits`` (B, V) and its logprob."""
    logits = logits.float()
    n_rows, vocab = logits.shape
    dev = logits.device
    temps = torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=dev)
    greedy = temps <= 0.0
    scale = torch.where(greedy, torch.ones_like(temps), temps)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)  # (B, V)
    tokens = logits.argmax(dim=-1)  # (B,)
    sampled_idx = [i for i, r in enumerate(rows) if r.temperature > 0.0]
    if sampled_idx:
        idx = torch.tensor(sampled_idx, device=dev)
        draws = _draw([rows[i] for i in sampled_idx], logp[idx], vocab)
        tokens[idx] = draws
    token_lp = logp.gather(1, tokens[:, None])[:, 0]
    top: list[list[tuple[float, int]] | None] = [None] * n_rows
    want = max(r.top_logprobs for r in rows)
    if want > 0:
        values, ids = logp.topk(min(want, vocab), dim=-1)
        vals_l, ids_l = values.tolist(), ids.tolist()
        for i, r in enumerate(rows):
            if r.top_logprobs > 0:
                top[i] = list(
                    zip(vals_l[i][: r.top_logprobs], ids_l[i][: r.top_logprobs], strict=True)
                )
    return Sampled(tokens.tolist(), token_lp.tolist(), top)


def _draw(rows: list[RowSampling], logp: torch.Tensor, vocab: int) -> torch.Tensor:
    """Inverse-CDF sampling of (S, V) log-probs, after each row's top-k / top-p filter."""
    probs = logp.exp()  # (S, V)
    dev = logp.device
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=dev)
    top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
    filtering = bool((top_k < vocab).any() or (top_p < 1.0).any())
    if filtering:
        probs, order = probs.sort(dim=-1, descending=True)  # (S, V)
        ranks = torch.arange(vocab, device=dev)[None, :]
        keep = ranks < top_k[:, None]
        before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
        keep &= before < top_p[:, None]
        probs = probs * keep
        n_keep = keep.sum(dim=-1)
    else:
        order = None
        n_keep = torch.full((len(rows),), vocab, device=dev)
    cdf = probs.cumsum(dim=-1)  # (S, V)
    # each row's own (CPU) generator: a request's draws do not depend on its batch or device
    uniform = torch.cat([torch.rand(1, generator=r.generator) for r in rows]).to(dev)  # (S,)
    target = uniform * cdf[:, -1]
    pos = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
    pos = torch.minimum(pos, n_keep - 1)
    if order is None:
        return pos
    return order.gather(1, pos[:, None])[:, 0]
