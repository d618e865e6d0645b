"""Vectorised building blocks: group statistics over arbitrary ids and discounted scans.

    group ids (B,) --unique/inverse--> dense ids --index_add--> per-group sums --gather--> (B,)
    x (B, T), mask (B, T) --compact--> generated tokens first --blocked scan--> --expand--> (B, T)

No function here loops over samples or groups. The discounted reverse scan
``y_t = x_t + d * y_{t+1}`` runs as a blocked matrix product: each block of ``block`` steps is
one (block x block) matmul, and the block boundaries form the same recurrence with discount
``d ** block``, solved recursively (in float64 for float32 inputs, so the blocks' rounding
errors do not add up along a row), so T = 8192 takes four small levels and no Python loop
over time steps. Every power of ``d`` used is ``<= 1``, so the scan is stable for any T.
Discounted returns that skip holes in the mask count them instead of packing the generated
tokens first (:func:`masked_discounted_returns`); large results go on huge pages on CPU
(:func:`empty_output`).

Masks are applied by float multiplication: ``torch.where`` and other kernels on bool tensors
are about 10x slower on CPU. Values under mask 0 must therefore be finite (:func:`float_mask`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.errors import ConfigError


def float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The 0/1 mask as a ``dtype`` tensor (itself when it already is one).

    Masks are applied by multiplication: on CPU, a float multiply is about 10x faster than
    ``torch.where`` on a bool mask. Entries under mask 0 must therefore be finite (an inf or
    NaN there would survive as NaN), as in the autograd path and in verl.
    """
    return mask if mask.dtype == dtype else mask.to(dtype)


THP = Path("/sys/kernel/mm/transparent_hugepage")
MADV_HUGEPAGE = 14


@functools.cache
def _huge_page_advice() -> tuple[Callable[[int, int, int], int], int] | None:
    """libc's ``madvise`` and the huge page size, where transparent huge pages are given on
    request (``[madvise]``); None elsewhere (``always``: the kernel already uses them; ``never``,
    not Linux, or no libc: nothing to ask for)."""
    if sys.platform != "linux":
        return None
    try:
        enabled = (THP / "enabled").read_text()
        size = int((THP / "hpage_pmd_size").read_text())
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, ValueError, AttributeError):
        return None
    if "[madvise]" not in enabled or size <= 0:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn, size


def empty_output(shape: Sequence[int], *, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``torch.empty(shape)`` on ``like``'s device, for a large result written once.

    On CPU a fresh tensor is mapped page by page as it is first written: a 32 MB (B, T) result
    takes 8192 page faults, which cost more than the arithmetic that fills it (about 25 ms here
    against 2 ms to read the same bytes). Where Linux gives transparent huge pages on request,
    the 2 MiB-aligned interior of a large tensor is advised onto huge pages (``madvise``), so it
    takes 16 faults instead; this is what ``THP_MEM_ALLOC_ENABLE=1`` makes torch's allocator do
    for every allocation. Elsewhere, or if the advice fails, it is a plain ``torch.empty``.
    """
    out = torch.empty(
        tuple(shape), dtype=like.dtype if dtype is None else dtype, device=like.device
    )
    advice = _huge_page_advice() if out.device.type == "cpu" else None
    if advice is not None and out.nbytes >= 2 * advice[1]:
        madvise, size = advice
        start = out.data_ptr()
        lo, hi = -(-start // size) * size, (start + out.nbytes) // size * size
        madvise(lo, hi - lo, MADV_HUGEPAGE)  # on failure the pages stay small: nothing lost
    return out


def check_same_shape(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Raise a ConfigError unless ``x`` and ``ref`` have the same shape."""
    if x.shape != ref.shape:
        raise ConfigError(
            f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; "
            f"they must match (token-level tensors are (B, T), sequence-level ones (B,))."
        )


def is_row_broadcast(x: Tensor, ref: Tensor) -> bool:
    """True if ``x`` is (B, 1) against a (B, T) ``ref`` with T > 1: one value per row."""
    return (
        x.dim() == 2
        and ref.dim() == 2
        and x.shape[0] == ref.shape[0]
        and x.shape[1] == 1 < ref.shape[1]
    )


def check_token_or_row(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Raise a ConfigError unless ``x`` is (B, T) like ``ref`` or a per-row (B, 1) broadcast."""
    if x.shape != ref.shape and not is_row_broadcast(x, ref):
        b = ref.shape[0] if ref.dim() else "B"
        raise ConfigError(
            f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; "
            f"{name} must be token-level {tuple(ref.shape)} or sequence-level ({b}, 1)."
        )


def dense_group_ids(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer ids (B,) to dense ids 0..G-1 (B,); returns (dense, G)."""
    if group_ids.dim() != 1:
        raise ConfigError(f"group_ids must be (B,), got shape {tuple(group_ids.shape)}")
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def group_mean_std(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std and group size, each (B,).

    mean_g = sum_{i in g} s_i / n_g;  std_g = sqrt(sum_{i in g} (s_i - mean_g)^2 / (n_g - 1)).
    A group of one has std 0 (not NaN). Two passes over the scores, for numerical stability.
    """
    dense, n_groups = dense_group_ids(group_ids)
    s = scores.to(torch.float64)
    count = torch.zeros(n_groups, dtype=s.dtype, device=s.device).index_add_(
        0, dense, torch.ones_like(s)
    )
    total = torch.zeros_like(count).index_add_(0, dense, s)
    mean = (total / count)[dense]
    sq = torch.zeros_like(count).index_add_(0, dense, (s - mean) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()[dense]
    dt = scores.dtype
    return mean.to(dt), std.to(dt), count[dense].to(dt)


def group_min_max(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample group minimum and maximum, each (B,)."""
    dense, n_groups = dense_group_ids(group_ids)
    lo = scores.new_zeros(n_groups).scatter_reduce_(0, dense, scores, "amin", include_self=False)
    hi = scores.new_zeros(n_groups).scatter_reduce_(0, dense, scores, "amax", include_self=False)
    return lo[dense], hi[dense]


BLOCK = 16
"""Block length of the discounted scan."""


def _discount_matrix(n: int, discount: float, like: Tensor) -> Tensor:
    """(n, n) matrix M with M[k, t] = discount ** (k - t) for k >= t, else 0."""
    idx = torch.arange(n, dtype=torch.float64)
    diff = idx[:, None] - idx[None, :]
    m = torch.where(
        diff >= 0, torch.tensor(discount, dtype=torch.float64) ** diff.clamp(min=0), 0.0
    )
    return m.to(dtype=like.dtype, device=like.device)


def discounted_reverse_cumsum(
    x: Tensor, discount: float, *, block: int = BLOCK, out: Tensor | None = None
) -> Tensor:
    """y_t = sum_{k >= t} discount^(k - t) x_k along the last dim of x (B, T) -> (B, T).

    ``out`` (contiguous, not x) receives the result when T is a multiple of ``block``.
    """
    if not 0.0 <= discount <= 1.0:
        raise ConfigError(f"discount must be in [0, 1], got {discount}")
    if discount == 0.0:
        return x.clone()
    b, t = x.shape
    if t <= block:
        return x @ _discount_matrix(t, discount, x)
    n = -(-t // block)
    if t % block:  # pad with zeros, which change no y_t
        return discounted_reverse_cumsum(F.pad(x, (0, n * block - t)), discount, block=block)[:, :t]
    flat_out = out.view(b * n, block) if out is not None else None
    local = torch.mm(x.reshape(b * n, block), _discount_matrix(block, discount, x), out=flat_out)
    local = local.view(b, n, block)
    # y at the start of block j = total of block j + discount^block * y at the start of block j + 1
    # the recursion over block starts runs in float64 (for float32 inputs), so the rounding
    # errors of the blocks do not add up along the row: each y_t is one block's float32 sum of
    # at most ``block`` terms plus one carry rounded once
    totals = local[:, :, 0].to(torch.promote_types(x.dtype, torch.float64))
    starts = discounted_reverse_cumsum(totals.contiguous(), discount**block, block=block)
    next_starts = F.pad(starts[:, 1:], (0, 1)).to(x.dtype)  # (B, n)
    offsets = torch.arange(block, dtype=torch.float64, device=x.device)
    decay = (discount ** (block - offsets)).to(x.dtype)  # (block,)
    return local.addcmul_(next_starts[:, :, None], decay).view(b, t)


class Scratch:
    """Buffers reused by the chunks of one call. Fresh CPU memory costs page faults, which on a
    busy host cost more than a chunk's arithmetic; ``get`` hands out the first ``rows`` rows of
    a buffer of that name, width and dtype, allocated on first use."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(
        self, name: str, rows: int, cols: int, like: Tensor, dtype: torch.dtype | None = None
    ) -> Tensor:
        dtype = like.dtype if dtype is None else dtype
        buf = self._bufs.get(name)
        if (
            buf is None
            or buf.shape[0] < rows
            or buf.shape[1] != cols
            or buf.dtype != dtype
            or buf.device != like.device
        ):
            buf = self._bufs[name] = torch.empty(rows, cols, dtype=dtype, device=like.device)
        return buf[:rows]

    def keep(self, name: str, make: Callable[[], Tensor]) -> Tensor:
        """A constant of this call (e.g. a small matrix), made on first use."""
        x = self._bufs.get(name)
        if x is None:
            x = self._bufs[name] = make()
        return x


def is_prefix_mask(mask: Tensor, scratch: Scratch | None = None) -> bool:
    """True if every row's mask is ones then zeros (no holes), so compaction is the identity."""
    if mask.shape[-1] < 2 or mask.numel() == 0:
        return True
    if not mask.is_floating_point():
        return not bool((mask[:, 1:] > mask[:, :-1]).any())
    r, t = mask.shape
    out = scratch.get("diff", r, t - 1, mask) if scratch is not None else None
    return bool(torch.sub(mask[:, 1:], mask[:, :-1], out=out).max() <= 0)  # no bool tensors


def compact_index(mask: Tensor, scratch: Scratch | None = None) -> Tensor:
    """For each (b, t) with mask 1, its rank among the row's mask-1 tokens; T where mask is 0."""
    m = float_mask(mask, torch.float32)  # float arithmetic: exact for ranks below 2**24
    r, t = m.shape
    rank = torch.cumsum(m, -1, out=scratch.get("rank", r, t, m) if scratch is not None else None)
    rank.sub_(1 + t).mul_(m).add_(t)  # (rank - 1 - T) * m + T
    if scratch is None:
        return rank.long()
    return scratch.get("index", r, t, m, torch.int64).copy_(rank)


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """Where the generated tokens of each row go in a dense (B, W) workspace, and back.

    ``pack`` moves each row's mask-1 tokens to the front (in order) and zero-fills the rest,
    so a recursion "over generated tokens only" becomes a plain recursion over a prefix.
    W is a multiple of ``BLOCK`` (no padding copy in the scan) and, for masks with holes,
    leaves column T free to collect the mask-0 entries. For prefix masks (single turn)
    ``pack`` is ``x * mask`` (entries under mask 0 must be finite) and no index is built.
    With a :class:`Scratch`, the index and packed tensors live in its reused buffers.
    """

    mask: Tensor  # (B, T) 0/1, floating (float32 unless the mask came as a float tensor)
    index: Tensor | None  # (B, T) rank of each mask-1 token; T on mask-0 tokens; None for prefixes
    width: int
    scratch: Scratch | None = None

    @classmethod
    def of(
        cls, mask: Tensor, scratch: Scratch | None = None, *, prefix: bool | None = None
    ) -> TokenLayout:
        """The layout of ``mask``; ``prefix``: :func:`is_prefix_mask` of it, if known."""
        m = mask if mask.is_floating_point() else float_mask(mask, torch.float32)
        t = m.shape[-1]
        if prefix if prefix is not None else is_prefix_mask(m, scratch):
            return cls(m, None, -(-t // BLOCK) * BLOCK, scratch)
        return cls(m, compact_index(m, scratch), -(-(t + 1) // BLOCK) * BLOCK, scratch)

    def pack(self, x: Tensor, name: str = "packed") -> Tensor:
        """(B, T) -> (B, W): mask-1 entries first, zeros elsewhere (a fresh tensor, or the
        scratch buffer ``name``)."""
        b, t = x.shape
        if self.scratch is not None:
            out = self.scratch.get(name, b, self.width, x)
        else:
            out = x.new_empty(b, self.width)
        if self.index is None:
            torch.mul(x, float_mask(self.mask, x.dtype), out=out[:, :t])
            out[:, t:] = 0.0
            return out
        out.zero_().scatter_(1, self.index, x)
        out[:, t] = 0.0  # the mask-0 entries landed here
        return out

    def unpack_into(self, y: Tensor, out: Tensor) -> Tensor:
        """:meth:`unpack` written into ``out`` (B, T), e.g. a row slice of a larger result."""
        t = self.mask.shape[-1]
        if self.index is None:
            return out.copy_(y[:, :t])
        return torch.gather(y, 1, self.index, out=out)

    def unpack(self, y: Tensor) -> Tensor:
        """(B, W) -> (B, T); assumes y is 0 past each row's generated tokens (true for scans of
        packed inputs), so mask-0 positions come back as 0."""
        t = self.mask.shape[-1]
        if self.index is None:
            return y if self.width == t else y[:, :t].contiguous()
        return y.gather(1, self.index)


CHUNK_ELEMENTS = 1 << 19
"""Elements per row chunk (2 MiB of fp32) of the chunked time recursions."""


def row_chunks(b: int, t: int, device: torch.device | None = None) -> list[slice]:
    """Slices of consecutive rows of a (B, T) batch, each about ``CHUNK_ELEMENTS`` elements
    (one slice of all rows on an accelerator, where chunks would only add kernel launches).

    The time recursions (GAE, discounted returns) run chunk by chunk: every temporary (packed
    rewards and values, deltas, the scan) stays in the CPU cache, and only the result is written
    to main memory once. On a 1024 x 8192 batch this is 3-4x faster than whole-batch passes,
    which each stream 32 MB through memory and page-fault a fresh 32 MB tensor.
    """
    if device is not None and device.type != "cpu":
        return [slice(0, b)]
    rows = max(1, CHUNK_ELEMENTS // max(t, 1))
    return [slice(i, min(i + rows, b)) for i in range(0, b, rows)]


COUNT_SCAN_MAX_EXPONENT = 600.0
"""Largest ``-ln(gamma) * T`` of :func:`count_scan`: gamma^(+-T) within float64."""


def count_scan_fits(t: int, gamma: float, dtype: torch.dtype) -> bool:
    """Whether :func:`count_scan` is exact here: its powers gamma^(-BLOCK) (``dtype``) and
    gamma^(+-T) (float64) stay far from overflow and underflow."""
    if not 0.0 < gamma < 1.0 or dtype not in (torch.float32, torch.float64):
        return False
    k = -math.log(gamma)
    return BLOCK * k <= 40.0 and t * k <= COUNT_SCAN_MAX_EXPONENT


def count_scan_inputs(mask: Tensor, dtype: torch.dtype, scratch: Scratch) -> tuple[Tensor, Tensor]:
    """Buffers for :func:`count_scan` of a chunk with this 0/1 ``mask`` (R, T): ``x`` (R, W)
    for the caller to fill at ``x[:, :T]`` (the tail is zeroed here) and the mask as a
    contiguous (R, W) ``dtype`` tensor (``mask`` itself when it already is one); W is T
    rounded up to a multiple of BLOCK."""
    r, t = mask.shape
    width = -(-t // BLOCK) * BLOCK
    x = scratch.get("count_x", r, width, mask, dtype)
    x[:, t:] = 0.0
    if width == t and mask.dtype == dtype and mask.is_contiguous():
        return x, mask
    m = scratch.get("count_m", r, width, mask, dtype)
    m[:, :t] = mask
    m[:, t:] = 0.0
    return x, m


def count_scan(
    x: Tensor, m: Tensor, gamma: float, scratch: Scratch, out: Tensor, *, masked: bool = True
) -> Tensor:
    """Discounted reverse sums over the mask-1 tokens of a chunk of rows, without packing them.

    ``x`` (R, W) holds values * mask (it is overwritten), ``m`` (R, W) the 0/1 mask, both
    from :func:`count_scan_inputs`; writes y * m (``masked``) or y into ``out`` (R, T),
    T <= W, where y_t = sum_{k >= t, m_k = 1} gamma^n(t, k) x_k and n(t, k) counts the mask-1
    tokens in [t, k): a hole carries the sum unchanged. With e_t the mask-1 tokens before t in
    its block and w_t = gamma^e_t:

        s_t = sum_{k >= t in the block} w_k x_k       (one matmul with a ones matrix)
        y_t = (s_t + c_j) / w_t                       (1 / w_t <= gamma^-BLOCK)

    where c_j = gamma^C_j y_(first token of block j + 1), C_j the mask-1 tokens of block j, is
    what enters block j. With N_j the mask-1 tokens before block j and a_j = s at its first
    token, the carries have a closed form, computed in float64 (no rounding adds up along the
    row): c_j = gamma^-N_j sum_{k > j} gamma^N_k a_k. Each y_t is one block's sum of at most
    BLOCK terms plus a carry rounded once, as in :func:`discounted_reverse_cumsum`. Needs
    :func:`count_scan_fits`.
    """
    log_g = math.log(gamma)

    def ones(upper: bool) -> Tensor:
        i = torch.arange(BLOCK, device=x.device)
        if upper:  # [j, t] = ln(gamma) where j < t: m @ it = e_t ln(gamma)
            return (i[:, None] < i[None, :]).to(torch.float64).mul_(log_g).to(x.dtype)
        return (i[:, None] >= i[None, :]).to(x.dtype)  # [k, t] = 1 where k >= t

    before = scratch.keep(f"count_before_{x.dtype}_{gamma!r}", lambda: ones(True))
    from_ = scratch.keep(f"count_from_{x.dtype}", lambda: ones(False))
    block_ones = scratch.keep(f"count_ones_{x.dtype}", lambda: x.new_ones(BLOCK))
    r, t = out.shape
    rn, n = x.numel() // BLOCK, x.shape[1] // BLOCK
    mb = m.view(rn, BLOCK)
    counts = torch.mv(mb, block_ones).view(r, n).to(torch.float64)  # C_j, exact
    w = torch.mm(mb, before, out=scratch.get("count_w", rn, BLOCK, x))  # e_t ln(gamma)
    w.exp_()
    s = torch.mm(x.view(rn, BLOCK).mul_(w), from_, out=scratch.get("count_s", rn, BLOCK, x))
    grow = counts.cumsum(-1).sub_(counts).mul_(log_g).exp_()  # gamma^N_j, N_j exclusive
    # sum_{k > j} gamma^N_k a_k, then / gamma^N_j: a suffix sum, so summed back to front
    tail = torch.mul(s[:, 0].view(r, n), grow).flip(-1).cumsum_(-1)[:, :-1].flip(-1)
    carry = x.new_zeros(r, n)
    torch.div(tail, grow[:, :-1], out=carry[:, :-1])  # c_j, rounded once
    s.view(r, n, BLOCK).add_(carry[:, :, None])
    torch.div(s.view(r, -1)[:, :t], w.view(r, -1)[:, :t], out=out)
    return out.mul_(m[:, :t]) if masked else out


def masked_discounted_returns(
    rewards: Tensor,
    mask: Tensor,
    gamma: float,
    *,
    on_chunk: Callable[[Tensor, Tensor], None] | None = None,
) -> Tensor:
    """G_t = r_t + gamma * G_next(t) over mask-1 tokens only (mask-0 tokens are skipped).

    next(t) is the next position after t with mask 1. Rewards on mask-0 tokens are dropped
    (they must be finite); the result is 0 on mask-0 tokens. (B, T) -> (B, T). Runs in row
    chunks (:func:`row_chunks`); ``on_chunk(G[rows], mask[rows])`` sees each chunk of the
    result while it is in cache (e.g. to accumulate statistics). With gamma = 1 skipping a
    token changes nothing, so masks with holes need no packing; float32/float64 rewards with
    gamma^T within float64 range need none either (:func:`count_scan`); otherwise the
    generated tokens are packed first (:class:`TokenLayout`).
    """
    check_same_shape("mask", mask, "rewards", rewards)
    out = empty_output(rewards.shape, like=rewards)
    b, t = rewards.shape
    scratch = Scratch()
    by_counts = count_scan_fits(t, gamma, rewards.dtype)
    for rows in row_chunks(b, t, rewards.device):
        m = float_mask(mask[rows], rewards.dtype)
        if gamma == 1.0 and t % BLOCK == 0 and t > BLOCK:
            x = torch.mul(rewards[rows], m, out=scratch.get("x", m.shape[0], t, rewards))
            discounted_reverse_cumsum(x, 1.0, out=out[rows]).mul_(m)
        elif by_counts:
            x, mw = count_scan_inputs(m, rewards.dtype, scratch)
            torch.mul(rewards[rows], m, out=x[:, :t])
            count_scan(x, mw, gamma, scratch, out[rows])
        else:
            layout = TokenLayout.of(m, scratch)
            packed = layout.pack(rewards[rows])
            y = scratch.get("scan", packed.shape[0], packed.shape[1], packed)
            layout.unpack_into(discounted_reverse_cumsum(packed, gamma, out=y), out[rows])
        if on_chunk is not None:
            on_chunk(out[rows], m)
    return out


def final_reward_returns(scores: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted returns (B, T) of a reward ``scores`` (B,) on each row's last mask-1 token.

    Closed form of :func:`masked_discounted_returns` for that case: G_t = gamma^k_t * s, with
    k_t the number of mask-1 tokens after t; 0 on mask-0 tokens.
    """
    m = float_mask(mask, scores.dtype)
    s = scores[:, None]
    if gamma == 1.0:
        return m * s
    after = m.cumsum(-1)  # tokens up to and including t
    total = after[:, -1:].clone()
    after.neg_().add_(total)  # tokens after t
    if gamma == 0.0:
        return torch.where(mask.bool() & (after == 0), s, 0.0)
    return after.mul_(math.log(gamma)).exp_().mul_(s).mul_(m)


def last_token_index(mask: Tensor) -> Tensor:
    """(B,) index of the last mask-1 token of each row (0 for an all-zero row)."""
    t = mask.shape[-1]
    return (t - 1 - mask.bool().flip(-1).long().argmax(-1)).clamp(min=0)


def scatter_to_last_token(values: Tensor, mask: Tensor) -> Tensor:
    """Place values (B,) on the last mask-1 token of each row of a (B, T) zero tensor."""
    has_tokens = mask.bool().any(-1)
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    src = torch.where(has_tokens, values, torch.zeros_like(values))
    return out.scatter_(1, last_token_index(mask)[:, None], src[:, None])
