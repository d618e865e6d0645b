"""TrainBatch: trajectories become tensors here, and nowhere else.

    list[TrajectoryGroup] -> TrainBatch.from_groups -> split(n) per data-parallel rank
        -> micro_batches(max_tokens=...) -> engine forward (padded, or pack() for padding-free)

One row per ``Segment`` (token ledger). A rollout with several segments (sub-agents, context
compaction, templates that are not prefix-preserving) gives several rows that share the
trajectory's group id and reward: by default every segment's row carries the trajectory reward
(``segment_reward="all"``); with ``segment_reward="last"`` only the last segment does and the
others get 0.

Alignment convention (token-aligned, the shift lives in the engine once):
every (B, T) field is indexed by token position. ``logprobs[b, t]`` is log p(input_ids[b, t] |
input_ids[b, :t]); it is computed from the logits at position t - 1, so position 0 has no
logprob and is always masked. ``loss_mask[b, t]`` is the ledger's mask for token t (1 where the
model generated token t) with position 0 forced to 0, so it multiplies ``logprobs`` and
``rollout_logprobs`` directly. ``values[b, t]`` (critic) is the value of the state before token t.

Rows whose trajectory ended in an infrastructure failure (``RolloutStatus.is_infra_failure``),
and by default all rows of a group that is not ``trainable``, keep their tokens (for metrics)
but get ``sample_mask = 0`` and an all-zero ``loss_mask``.

Padding is on the right with ``pad_token_id`` (``versions`` pads with -1, every other field
with 0). Any tensor field with two or more dims has time on dim 1; ``select``, ``split`` and
``micro_batches`` trim padding to the longest row they keep, and ``concat`` pads back.
A field of shape (B, 1, ...) in a batch with T > 1 is a per-row value broadcast over time
(the (B, 1) advantages and returns of the sequence-level estimators): it is never trimmed or
padded, so it costs B values instead of B x T in memory and in the object store. ``concat``
keeps it (B, 1) when every part has it so, and expands it to (B, T) when it must join a part
whose field is token-level. (In a batch with T = 1 the two readings coincide; such a field is
treated as token-level, which only affects padding positions.)
``group_ids`` are always 0..G-1 in order of first appearance in the batch; a group's identity
across split/concat is ``RowInfo.group_key``.

tensordict's ``TensorDict`` holds the tensors (batched indexing, ``.to(device)``, pickling for
the object store); row metadata that is not a tensor lives in ``rows`` beside it.

Images (a vision-language model's prompts) are row metadata too: ``RowInfo.images`` holds the
data URLs of a row's images in the order of their placeholder tokens (``Segment.images``), so
``select``/``split``/``micro_batches``/``concat`` carry them with their rows, and the engine
turns the rows' images into pixels for the forward (``agentrl.vision.Vision.pixels``), the
same way the inference server did. A row's images are never tensors here: they differ in
size and count, and as URLs they cost their PNG bytes, not their pixels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDict

from agentrl.errors import ConfigError, TokenizationError
from agentrl.types import RolloutStatus, Segment, TrajectoryGroup

SegmentReward = Literal["all", "last"]
_PAD_MINUS_ONE = frozenset({"versions"})


@dataclass(frozen=True, slots=True)
class RowInfo:
    """What a row is, beyond its tensors."""

    uid: str  # the prompt's uid (TrajectoryGroup.uid)
    trajectory_id: str
    status: RolloutStatus
    segment_index: int  # which segment of the trajectory this row is
    num_segments: int
    group_key: str  # identity of the group across split/concat
    images: tuple[str, ...] = ()  # data URLs of the row's images, in placeholder order


@dataclass(frozen=True, kw_only=True)
class PackedBatch:
    """The rows of a TrainBatch concatenated into one row, for padding-free forwards.

    ``position_ids`` restart at 0 for each sequence; HF models detect the sequence boundaries
    from them (block-diagonal causal attention). ``unpack`` maps a (1, N) result back to (B, T).
    """

    input_ids: torch.Tensor  # (1, N) N = total real tokens
    position_ids: torch.Tensor  # (1, N)
    cu_seqlens: torch.Tensor  # (B + 1,) int32, start offsets of each sequence
    max_seqlen: int
    batch_shape: tuple[int, int]  # (B, T) of the padded batch
    flat_index: torch.Tensor  # (N,) positions of the real tokens in the flattened (B * T)

    def pack(self, x_BT: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (1, N, ...)."""
        return x_BT.reshape(-1, *x_BT.shape[2:])[self.flat_index].unsqueeze(0)

    def unpack(self, x_N: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(1, N, ...) or (N, ...) -> (B, T, ...), ``fill`` at padding."""
        x_N = x_N.squeeze(0) if x_N.dim() > 1 and x_N.shape[0] == 1 else x_N
        b, t = self.batch_shape
        out = x_N.new_full((b * t, *x_N.shape[1:]), fill)
        out[self.flat_index] = x_N
        return out.view(b, t, *x_N.shape[1:])


def _group_key(group: TrajectoryGroup) -> str:
    text = group.uid + "|" + "|".join(t.id for t in group.trajectories)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _dense_group_ids(rows: Sequence[RowInfo]) -> torch.Tensor:
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(r.group_key, len(index)) for r in rows], dtype=torch.long)


def _padded(
    rows: Sequence[Sequence[int] | Sequence[float]], t: int, pad: float, dtype: torch.dtype
) -> torch.Tensor:
    out = torch.full((len(rows), t), pad, dtype=dtype)
    for r, xs in enumerate(rows):
        out[r, : len(xs)] = torch.tensor(xs, dtype=dtype)
    return out


def _cat_time_field(parts: list[torch.Tensor], t: int) -> torch.Tensor:
    """Concatenate one field's parts along rows; per-row (B, 1) parts that meet token-level
    (B, t) parts are expanded to (B, t) first (a broadcast, so padding gets the row's value)."""
    widths = {p.shape[1] for p in parts if p.dim() >= 2}
    if len(widths) > 1:
        parts = [p.expand(p.shape[0], t, *p.shape[2:]) if p.shape[1] == 1 else p for p in parts]
    return torch.cat(parts)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _contiguous_partition(weights: Sequence[int], n: int) -> list[range]:
    """Cut ``weights`` into exactly ``n`` non-empty contiguous ranges minimising the largest sum."""
    lo, hi = max(weights), sum(weights)

    def pieces(cap: int) -> int:
        count, cur = 1, 0
        for w in weights:
            if cur + w > cap:
                count, cur = count + 1, 0
            cur += w
        return count

    while lo < hi:  # smallest capacity that needs at most n pieces
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pieces(mid) <= n else (mid + 1, hi)
    cuts: list[range] = []
    start = cur = 0
    for i, w in enumerate(weights):
        pieces_after = n - len(cuts) - 1  # pieces still to open after the current one
        if i > start and (cur + w > lo or len(weights) - i == pieces_after):
            cuts.append(range(start, i))
            start, cur = i, 0
        cur += w
    cuts.append(range(start, len(weights)))
    return cuts


class TrainBatch:
    """B rows of token-aligned training tensors plus their row metadata (see module docstring).

    Standard fields, all on ``td`` (extra fields such as ``advantages`` or ``old_logprobs`` are
    added with ``batch["advantages"] = x``; ``advantages`` and ``returns`` are (B, T), or
    (B, 1) from a sequence-level estimator, see the module docstring)::

        input_ids         (B, T) long   right-padded with pad_token_id
        attention_mask    (B, T) long   1 on real tokens
        position_ids      (B, T) long   0..L-1 per row, 0 on padding
        loss_mask         (B, T) float  1 on generated tokens of trainable rows; column 0 is 0
        rollout_logprobs  (B, T) float  the inference server's logprob of token t; 0 elsewhere
        versions          (B, T) long   weight version that generated token t; -1 elsewhere
        token_rewards     (B, T) float  the row's reward at its last generated token
        rewards           (B,)   float
        group_ids         (B,)   long   0..G-1, order of first appearance
        sample_mask       (B,)   float  0 for masked rows (infra failure / failed group)
        seq_lens          (B,)   long   real tokens per row
    """

    __slots__ = ("pad_to_multiple_of", "pad_token_id", "rows", "td")

    def __init__(
        self,
        td: TensorDict,
        rows: Sequence[RowInfo],
        *,
        pad_token_id: int,
        pad_to_multiple_of: int = 1,
    ) -> None:
        if td.batch_size[0] != len(rows):
            raise ValueError(
                f"TrainBatch has {td.batch_size[0]} tensor rows but {len(rows)} RowInfos"
            )
        self.td = td
        self.rows = tuple(rows)
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def from_groups(
        cls,
        groups: Iterable[TrajectoryGroup],
        pad_token_id: int,
        *,
        segment_reward: SegmentReward = "all",
        mask_failed_groups: bool = True,
        pad_to_multiple_of: int = 1,
    ) -> TrainBatch:
        """One row per non-empty segment of every trajectory, in group/trajectory/segment order."""
        if segment_reward not in ("all", "last"):
            raise ConfigError(f"segment_reward must be 'all' or 'last', got {segment_reward!r}")
        items: list[tuple[Segment, float, bool, RowInfo]] = []
        for group in groups:
            key = _group_key(group)
            group_ok = group.trainable or not mask_failed_groups
            for traj in group.trajectories:
                segs = [s for s in traj.segments if len(s)]
                for i, seg in enumerate(segs):
                    try:
                        seg.validate()
                    except ValueError as e:
                        raise TokenizationError(f"trajectory {traj.id}: {e}") from None
                    last = i == len(segs) - 1
                    reward = traj.reward if segment_reward == "all" or last else 0.0
                    ok = group_ok and not traj.status.is_infra_failure
                    info = RowInfo(
                        group.uid, traj.id, traj.status, i, len(segs), key, tuple(seg.images)
                    )
                    items.append((seg, reward, ok, info))
        if not items:
            raise ConfigError(
                "TrainBatch.from_groups got no segment with tokens; pass groups whose "
                "trajectories have non-empty segments"
            )
        return cls._from_segments(items, pad_token_id, pad_to_multiple_of)

    @classmethod
    def _from_segments(
        cls, items: list[tuple[Segment, float, bool, RowInfo]], pad_token_id: int, multiple: int
    ) -> TrainBatch:
        segs = [seg for seg, *_ in items]
        b, t = len(segs), _round_up(max(len(s) for s in segs), multiple)
        seq_lens = torch.tensor([len(s) for s in segs], dtype=torch.long)
        attention_mask = (torch.arange(t) < seq_lens[:, None]).long()
        ledger_mask = _padded([s.loss_mask for s in segs], t, 0, torch.float32)
        ok = torch.tensor([float(ok) for _, _, ok, _ in items])
        rewards = torch.tensor([reward for _, reward, _, _ in items], dtype=torch.float32)
        loss_mask = ledger_mask * ok[:, None]
        loss_mask[:, 0] = 0.0  # no logprob exists for the first token
        token_rewards = torch.zeros(b, t)
        has_gen = ledger_mask.any(dim=1)
        last_gen = t - 1 - ledger_mask.flip(1).argmax(dim=1)  # last generated position per row
        token_rewards[has_gen.nonzero().squeeze(1), last_gen[has_gen]] = rewards[has_gen]
        rows = [info for *_, info in items]
        fields = {
            "input_ids": _padded([s.token_ids for s in segs], t, pad_token_id, torch.long),
            "attention_mask": attention_mask,
            "position_ids": torch.arange(t).expand(b, t) * attention_mask,
            "loss_mask": loss_mask,
            "rollout_logprobs": _padded([s.logprobs for s in segs], t, 0, torch.float32),
            "versions": _padded([s.versions for s in segs], t, -1, torch.long),
            "token_rewards": token_rewards,
            "rewards": rewards,
            "group_ids": _dense_group_ids(rows),
            "sample_mask": ok,
            "seq_lens": seq_lens,
        }
        td = TensorDict(fields, batch_size=[b])
        return cls(td, rows, pad_token_id=pad_token_id, pad_to_multiple_of=multiple)

    # ---- field access ---------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.td.batch_size[0])

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.td:
            raise KeyError(f"TrainBatch has no field {key!r}; fields: {sorted(self.td.keys())}")
        value: torch.Tensor = self.td.get(key)
        return value

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        b, t = len(self), self.seq_len
        if (
            value.dim() == 0
            or value.shape[0] != b
            or (value.dim() >= 2 and value.shape[1] not in (t, 1))
        ):
            raise ValueError(
                f"field {key!r} must be (B,) or (B, T, ...) with B={b}, T={t}, or (B, 1, ...) "
                f"for one value per row broadcast over time; got {tuple(value.shape)}"
            )
        self.td.set(key, value)

    def __contains__(self, key: str) -> bool:
        return key in self.td

    def __repr__(self) -> str:
        return (
            f"TrainBatch(B={len(self)}, T={self.seq_len}, tokens={self.num_tokens}, "
            f"fields={sorted(self.td.keys())})"
        )

    @property
    def seq_len(self) -> int:
        """T, the padded length."""
        return int(self.td.get("input_ids").shape[1])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.td.get("seq_lens").sum())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.td.get("loss_mask").sum())

    @property
    def device(self) -> torch.device:
        return self.td.get("input_ids").device  # type: ignore[no-any-return]

    input_ids = property(lambda self: self["input_ids"])  # (B, T)
    attention_mask = property(lambda self: self["attention_mask"])  # (B, T)
    position_ids = property(lambda self: self["position_ids"])  # (B, T)
    loss_mask = property(lambda self: self["loss_mask"])  # (B, T)
    rollout_logprobs = property(lambda self: self["rollout_logprobs"])  # (B, T)
    versions = property(lambda self: self["versions"])  # (B, T)
    token_rewards = property(lambda self: self["token_rewards"])  # (B, T)
    rewards = property(lambda self: self["rewards"])  # (B,)
    group_ids = property(lambda self: self["group_ids"])  # (B,)
    sample_mask = property(lambda self: self["sample_mask"])  # (B,)
    seq_lens = property(lambda self: self["seq_lens"])  # (B,)

    @property
    def images(self) -> list[tuple[str, ...]]:
        """Each row's images (data URLs, in placeholder order); empty tuples for text rows."""
        return [r.images for r in self.rows]

    @property
    def has_images(self) -> bool:
        return any(r.images for r in self.rows)

    # ---- reshaping ------------------------------------------------------------------------

    def _pad_value(self, key: str) -> float:
        if key == "input_ids":
            return float(self.pad_token_id)
        return -1.0 if key in _PAD_MINUS_ONE else 0.0

    def _with_length(self, td: TensorDict, t: int) -> TensorDict:
        """Trim or right-pad every time-axis field of ``td`` to length ``t``; per-row (B, 1)
        fields of a batch with T > 1 stay as they are."""
        src_t = int(td.get("input_ids").shape[1])
        out = {}
        for key in map(str, td.keys()):
            x = td.get(key)
            if x.dim() >= 2 and x.shape[1] == 1 and src_t != 1:
                pass  # one value per row, broadcast over time
            elif x.dim() >= 2 and x.shape[1] > t:
                x = x[:, :t]
            elif x.dim() >= 2 and x.shape[1] < t:
                pad = x.new_full((x.shape[0], t - x.shape[1], *x.shape[2:]), self._pad_value(key))
                x = torch.cat([x, pad], dim=1)
            out[key] = x
        return TensorDict(out, batch_size=td.batch_size, device=td.device)

    def select(self, indices: Sequence[int] | torch.Tensor) -> TrainBatch:
        """The given rows, in the given order, padding trimmed to the longest of them."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        if idx.numel() == 0:
            raise ConfigError("TrainBatch.select needs at least one row index")
        td = self.td[idx.to(self.device)]
        longest = int(td.get("seq_lens").max())
        td = self._with_length(td, _round_up(longest, self.pad_to_multiple_of))
        rows = [self.rows[i] for i in idx.tolist()]
        td.set("group_ids", _dense_group_ids(rows).to(td.device))
        return TrainBatch(
            td, rows, pad_token_id=self.pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of
        )

    def split(self, n: int) -> list[TrainBatch]:
        """``n`` non-empty contiguous parts with balanced real-token counts (order preserved).

        Contiguous cuts keep ``concat(batch.split(n))`` equal to ``batch``, so per-rank results
        line up with the batch without bookkeeping; the cut points minimise the largest part's
        token count. Deterministic.
        """
        if not 1 <= n <= len(self):
            raise ConfigError(
                f"cannot split a TrainBatch of {len(self)} rows into {n} non-empty "
                f"parts; use 1 <= n <= {len(self)}"
            )
        weights = [int(x) for x in self.td.get("seq_lens").tolist()]
        return [self.select(list(r)) for r in _contiguous_partition(weights, n)]

    def micro_batches(
        self, *, max_tokens: int | None = None, size: int | None = None, num: int | None = None
    ) -> list[TrainBatch]:
        """Contiguous micro-batches: by real-token budget, by row count, or exactly ``num``.

        ``max_tokens`` bounds the real tokens of each micro-batch (a row longer than the budget
        gets a micro-batch of its own); ``size`` takes rows ``size`` at a time; ``num`` is
        ``split(num)``.
        """
        given = [x for x in (max_tokens, size, num) if x is not None]
        if len(given) != 1 or given[0] < 1:
            raise ConfigError(
                "micro_batches needs exactly one positive argument of max_tokens, "
                f"size, num; got max_tokens={max_tokens}, size={size}, num={num}"
            )
        if num is not None:
            return self.split(num)
        if size is not None:
            return [
                self.select(list(range(i, min(i + size, len(self)))))
                for i in range(0, len(self), size)
            ]
        assert max_tokens is not None
        parts: list[list[int]] = [[]]
        used = 0
        for i, n in enumerate(self.td.get("seq_lens").tolist()):
            if parts[-1] and used + n > max_tokens:
                parts.append([])
                used = 0
            parts[-1].append(i)
            used += n
        return [self.select(p) for p in parts]

    @classmethod
    def concat(cls, batches: Sequence[TrainBatch]) -> TrainBatch:
        """Rows of all batches in order; padded to the longest; group ids renumbered densely."""
        if not batches:
            raise ConfigError("TrainBatch.concat needs at least one batch")
        first = batches[0]
        keys = set(first.td.keys())
        for b in batches[1:]:
            if set(b.td.keys()) != keys or b.pad_token_id != first.pad_token_id:
                raise ConfigError(
                    "TrainBatch.concat needs batches with the same fields and pad id; "
                    f"got {sorted(keys)} and {sorted(b.td.keys())}"
                )
        t = max(b.seq_len for b in batches)
        tds = [first._with_length(b.td, t) for b in batches]
        rows = [r for b in batches for r in b.rows]
        fields = {k: _cat_time_field([x.get(k) for x in tds], t) for k in map(str, first.td.keys())}
        fields["group_ids"] = _dense_group_ids(rows).to(first.device)
        td = TensorDict(fields, batch_size=[len(rows)], device=first.td.device)
        return cls(
            td, rows, pad_token_id=first.pad_token_id, pad_to_multiple_of=first.pad_to_multiple_of
        )

    def add_fields(self, fields: BatchFields, names: Mapping[str, str] | None = None) -> None:
        """Set ``fields`` (computed on these rows, e.g. by a scoring call) on the batch, each
        under ``names.get(key, key)``; time fields are padded (0) or trimmed to ``seq_len``."""
        if len(fields) != len(self):
            raise ValueError(f"{fields!r} has {len(fields)} rows; the batch has {len(self)}")
        names = names or {}
        for key in fields:
            self[names.get(key, key)] = fields.with_length(key, self.seq_len)

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(
            self.td.to(device),
            self.rows,
            pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )

    def pack(self) -> PackedBatch:
        """Concatenate the rows into one (1, N) row with per-sequence position ids."""
        mask = self.td.get("attention_mask").reshape(-1).bool()
        flat_index = mask.nonzero().squeeze(1)
        seq_lens = self.td.get("seq_lens")
        cu = torch.zeros(len(self) + 1, dtype=torch.int32, device=seq_lens.device)
        cu[1:] = seq_lens.cumsum(0)
        return PackedBatch(
            input_ids=self.td.get("input_ids").reshape(-1)[flat_index].unsqueeze(0),
            position_ids=self.td.get("position_ids").reshape(-1)[flat_index].unsqueeze(0),
            cu_seqlens=cu,
            max_seqlen=int(seq_lens.max()),
            batch_shape=(len(self), self.seq_len),
            flat_index=flat_index,
        )


class BatchFields:
    """Some fields of a TrainBatch's rows without the rest of the batch: what a scoring call
    returns (``logprobs``, ``entropy``, ``values``), so only new tensors travel back to the driver.

    Each field is (B,) or (B, T, ...) like a TrainBatch field (or (B, 1, ...), one value per
    row). ``concat`` joins the per-rank parts in order, right-padding the time axis with 0 to
    the longest part (each shard of a split is trimmed to its own longest row);
    ``TrainBatch.add_fields`` sets them on the batch they were computed from.
    """

    __slots__ = ("tensors",)

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        rows = {int(t.shape[0]) for t in tensors.values() if t.dim()}
        if len(rows) > 1 or any(t.dim() == 0 for t in tensors.values()):
            shapes = {k: tuple(t.shape) for k, t in tensors.items()}
            raise ValueError(f"BatchFields need (B, ...) tensors with one B; got {shapes}")
        self.tensors = dict(tensors)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise KeyError(f"BatchFields has no field {key!r}; fields: {sorted(self.tensors)}")
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0]) if self.tensors else 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def with_length(self, key: str, t: int) -> torch.Tensor:
        """Field ``key`` with its time axis padded (0) or trimmed to ``t`` ((B,) and per-row
        (B, 1, ...) fields as they are)."""
        x = self[key]
        if x.dim() < 2 or x.shape[1] in (t, 1):
            return x
        if x.shape[1] > t:
            return x[:, :t]
        return torch.cat([x, x.new_zeros((x.shape[0], t - x.shape[1], *x.shape[2:]))], dim=1)

    @classmethod
    def concat(cls, parts: Sequence[BatchFields]) -> BatchFields:
        """The rows of every part, in order; time fields padded with 0 to the longest part."""
        if not parts:
            raise ConfigError("BatchFields.concat needs at least one part")
        keys = parts[0].keys()
        if any(p.keys() != keys for p in parts):
            raise ConfigError(
                f"BatchFields.concat needs parts with the same fields; got "
                f"{sorted({tuple(p.keys()) for p in parts})}"
            )
        out = {}
        for key in keys:
            xs = [p[key] for p in parts]
            t = max((x.shape[1] for x in xs if x.dim() >= 2), default=1)
            xs = [p.with_length(key, t) for p in parts]
            out[key] = _cat_time_field(xs, t) if t > 1 else torch.cat(xs)
        return cls(out)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.tensors.items())
        return f"BatchFields({shapes})"
