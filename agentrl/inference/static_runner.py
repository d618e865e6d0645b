"""The static engine: continuous batching over a preallocated slot KV cache (CUDA graphs on GPU).

    submit() -> waiting queue --(free slots, step boundary)--> batched prefill into slots
        [B, B + n) -> sample on the device -> decode steps over slots [0, B): one token per
        row, k/v written at each row's position in its slot, attention over the slot's prefix
        (a length mask) -> the step's tokens copied to pinned host memory -> the next step is
        launched before the host reads them (CUDA) -> finished rows free their slots; the
        last rows move into the holes (slots stay packed at [0, B))

The cache is ``SlotCache`` (``decoder.py``): ``(layers, slots, kv_heads, max_len, head_dim)``,
allocated once from ``kv_cache_gb`` and ``max_seq_len``. A request holds one slot from its
prefill to its last token; rows join and leave without any tensor being re-padded or
concatenated, so a decode step has the same shapes whatever the traffic and replays as a
CUDA graph, one per (batch-size bucket, attended-length bucket) (``decode_graphs.py``): all
captured at start with ``capture_graphs`` eager (``capture_all``, before the server answers),
else on first use.
Requests beyond the free slots wait in the queue (never fail); a prompt that does not fit a
slot is refused by the server (``max_context`` is the slot length).

Sampling (temperature, top-p, top-k, seeded) runs on the device (``device_sampling.py``); the
host reads one small tensor per step (tokens and logprobs), does the per-request bookkeeping
(stop tokens and strings, lengths, versions) and only touches the device again when the batch
changes. With CUDA graphs that reading overlaps the next step (``_decode_ahead``): step k + 1
is replayed before step k's tokens are read, so the device never waits for the host's Python;
a row that step k finishes wastes one token of step k + 1 (dropped), and anything that changes
the batch (a prefill, an abort, a weight update, pause) first reads the step in flight. Weight updates, pause and abort go through ``ModelRunner.call`` as before: they run
between steps, and the forward reads the model's own parameters, so the next step uses them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.inference.buckets import CAPTURE_MODES, cache_shape
from agentrl.inference.decode_graphs import DecodeGraphs
from agentrl.inference.decoder import Decoder, SlotCache, check_supported
from agentrl.inference.device_sampling import sample_on_device
from agentrl.inference.prefix_pool import PrefixPool, common_prefix
from agentrl.inference.runner import ModelRunner
from agentrl.inference.runner_types import RunnerRequest

logger = logging.getLogger(__name__)
MIN_REUSE = 16
"""Shortest shared prompt prefix worth copying from a running request's slot."""


class StaticRunner(ModelRunner):
    """``ModelRunner`` with a slot KV cache, our own forward and device sampling."""

    def __init__(self, cfg: ModelRunner.Config) -> None:
        super().__init__(cfg)
        self.decoder = Decoder(self.model, compile_pointwise=cfg.compile_pointwise)
        self.device = torch.device(cfg.device)
        slots, max_len = cache_shape(cfg, self.model, self.dtype)
        self.cache = SlotCache.allocate(self.model, slots, max_len, self.dtype, self.device)
        self.max_context = max_len
        self.slots: list[RunnerRequest] = []  # slot i runs slots[i]; packed at [0, B)
        self.lens: list[int] = []  # tokens in each slot's cache = position of its pending token
        dev, n = self.device, slots
        self._tok = torch.zeros(n, dtype=torch.long, device=dev)  # pending token per slot
        self._pos = torch.zeros(n, dtype=torch.long, device=dev)
        self._draw = torch.zeros(n, dtype=torch.long, device=dev)  # next draw index
        self._seed = torch.zeros(n, dtype=torch.long, device=dev)
        # free slots keep every token: a top-k of 0 would make a filtering graph's padding
        # rows draw index -1 (an out-of-bounds gather: a device assert on CUDA)
        self._top_k = torch.full((n,), self.vocab_size, dtype=torch.long, device=dev)
        self._temp = torch.ones(n, dtype=torch.float32, device=dev)
        self._top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self._active = torch.zeros(n, dtype=torch.long, device=dev)  # 1: the slot runs
        self.pool = PrefixPool()  # finished requests' KV parked in free slots
        self._kv_epoch = 0  # bumped whenever the weights change: older KV is never reused
        self._filtering = False  # some running row filters (top-k/top-p)
        self._decode_s = 0.0  # wall time in decode steps (graph or forward, sampling, host)
        self._prefill_s = 0.0  # wall time in prefills
        self._dirty = True  # the device copies above are stale: rebuild before the next step
        self._pending: _InFlight | None = None  # the graph step launched, not read yet
        cuda = self.device.type == "cuda"
        self._host_bufs = [
            (
                torch.zeros(n, dtype=torch.long, pin_memory=cuda),
                torch.zeros(n, dtype=torch.float32, pin_memory=cuda),
                torch.cuda.Event() if cuda else None,
            )
            for _ in range(2)
        ]
        self._flip = 0
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        self.overlap = self.use_graphs
        """Launch each decode step before reading the one before it (``_decode_ahead``): on
        with CUDA graphs; on CPU, where a step runs as it is launched, there is nothing to
        overlap (tests turn it on to check the bookkeeping)."""
        self.stats.update(
            slots=slots,
            max_len=max_len,
            graphs_captured=0,
            prefix_hit_tokens=0,
            prompt_tokens=0,
            pool_hit_tokens=0,
        )
        self.graphs = DecodeGraphs(
            self._step,
            state=(self._tok, self._pos, self._draw),
            slots=slots,
            max_len=max_len,
            device=self.device,
            stats=self.stats,
        )
        self._weight_ptrs = self._param_ptrs()
        if cfg.capture_graphs not in CAPTURE_MODES:
            raise ConfigError(
                f"capture_graphs must be one of {', '.join(CAPTURE_MODES)}, "
                f"got {cfg.capture_graphs!r}."
            )
        if cfg.capture_graphs != "lazy":
            self.capture_all(filtering=cfg.capture_graphs == "all")

    # ---- overrides of the batch bookkeeping --------------------------------------------
    def _running(self) -> list[RunnerRequest]:
        return list(self.slots)

    def _has_running(self) -> bool:
        return bool(self.slots)

    def _room(self) -> int:
        return self.cache.slots - len(self.slots)

    def _remove_running(self, ids: set[int]) -> None:
        self._pending = None  # commands flush it first; this drops it only after a failure
        self._free([i for i, r in enumerate(self.slots) if id(r) in ids], park=False)

    def info(self) -> dict[str, Any]:
        out = super().info()
        used = sum(self.lens)
        out.update(
            kv_tokens_used=used,
            kv_tokens_total=self.cache.slots * self.cache.max_len,
            kv_use=used / (self.cache.slots * self.cache.max_len),
            engine="static",
            prefix_hit_rate=self.stats["prefix_hit_tokens"] / max(self.stats["prompt_tokens"], 1),
            pool_hit_rate=self.stats["pool_hit_tokens"] / max(self.stats["prompt_tokens"], 1),
            pool_entries=len(self.pool),
            pool_parked=self.pool.parked,
            pool_evicted=self.pool.evicted,
            decode_ms_per_step=1e3 * self._decode_s / max(self.stats["decode_steps"], 1),
            decode_s=self._decode_s,
            prefill_s=self._prefill_s,
            **self.graphs.info(),
        )
        return out

    def set_weight_version(self, version: int | None) -> int:
        if self._param_ptrs() != self._weight_ptrs:  # parameters were replaced, not copied into
            self.decoder.fuse()
            self.graphs.clear()
            self._weight_ptrs = self._param_ptrs()
        version = super().set_weight_version(version)
        self.weights_changed()  # KV made by older weights is never reused
        for req in self._waiting:
            if req.output_ids:  # retracted: its next tokens come from these weights
                req.version_marks.append((len(req.output_ids), version))
        return version

    def weights_changed(self) -> None:
        self._kv_epoch += 1
        self.pool.clear()

    def drop_prefix_cache(self) -> int:
        """Forget every finished request's parked KV (the running requests keep theirs)."""
        dropped = len(self.pool.entries)
        self.pool.clear()
        return dropped

    def _retract(self) -> None:
        """Free every running request's slot and put it back at the head of the queue: its
        next prefill recomputes its prompt and its tokens so far with the weights served then,
        and sampling goes on from its next token (same seed, same draw index)."""
        self._flush()
        running = list(self.slots)
        self._pending = None
        del self.slots[:], self.lens[:]
        self._dirty = True
        self._waiting.extendleft(reversed(running))

    def _param_ptrs(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    # ---- engine thread ------------------------------------------------------------------
    def _admit_next(self, donors: dict[tuple[int, ...], list[int]]) -> list[RunnerRequest]:
        """The next requests to prefill. One that starts like another taken now (a GRPO
        group's prompt) and like no running one waits a step, to reuse the first's KV."""
        room, longest = self._room(), 0
        taken: list[RunnerRequest] = []
        deferred: list[RunnerRequest] = []
        heads: set[tuple[int, ...]] = set()
        while self._waiting and len(taken) < room:
            req = self._waiting[0]
            head = tuple(req.input_ids[:MIN_REUSE])
            if len(req.input_ids) > MIN_REUSE and head in heads and head not in donors:
                deferred.append(self._waiting.popleft())
                continue
            n = len(req.input_ids) + len(req.output_ids)  # a retracted one: both again
            if taken and max(longest, n) * (len(taken) + 1) > self.cfg.max_prefill_tokens:
                break
            longest = max(longest, n)
            heads.add(head)
            taken.append(self._waiting.popleft())
        self._waiting.extendleft(reversed(deferred))
        return taken

    def _donors(self) -> dict[tuple[int, ...], list[int]]:
        """Running slots whose prompt KV the weights served now made, by first prompt tokens
        (KV is keyed by the weights' epoch: after any update nothing older is reused)."""
        donors: dict[tuple[int, ...], list[int]] = {}
        for i, r in enumerate(self.slots):
            if r.kv_epoch == self._kv_epoch:
                donors.setdefault(tuple(r.input_ids[:MIN_REUSE]), []).append(i)
        return donors

    def _reuse(
        self, reqs: list[RunnerRequest], first: int, donors: dict[tuple[int, ...], list[int]]
    ) -> list[int]:
        """Copy into each new request's slot the longest prompt prefix it shares with a
        donor; returns how many prompt tokens each skips (at least one is always computed)."""
        starts, src, dst, pooled = [], [], [], 0
        use_pool = self.cfg.prefix_pool
        for j, req in enumerate(reqs):
            best, donor = 0, -1
            for i in donors.get(tuple(req.input_ids[:MIN_REUSE]), [])[:4]:
                shared = common_prefix(req.input_ids, self.slots[i].input_ids)
                if shared > best:
                    best, donor = shared, i
            slot, shared = -1, 0
            if use_pool and not req.output_ids:  # a retracted request re-prefills its tokens
                slot, shared = self.pool.best(req.input_ids, self._kv_epoch)
            from_pool = shared > best
            if from_pool:  # a finished request's tokens: the conversation's previous turn
                best, donor = shared, slot
            best = min(best, len(req.input_ids) - 1)
            if best >= MIN_REUSE:
                src.append(donor)
                dst.append(first + j)
                pooled += best if from_pool else 0
            starts.append(best if best >= MIN_REUSE else 0)
        # parked entries in the slots about to be written move up, in the same copy
        n = len(reqs)
        free = list(range(first + n, self.cache.slots))
        moved_src, moved_dst = self.pool.evacuate(first, first + n, free)
        length = max([*starts, *(len(self.pool.entries[d].tokens) for d in moved_dst)], default=0)
        if src or moved_src:
            self.cache.move(src + moved_src, dst + moved_dst, length)
        self.stats["prefix_hit_tokens"] += sum(starts)
        self.stats["pool_hit_tokens"] += pooled
        self.stats["prompt_tokens"] += sum(len(r.input_ids) for r in reqs)
        return starts

    def _prefill(self) -> None:
        self._flush()
        if self._room() <= 0:
            return
        start = time.perf_counter()
        self._prefill_batch()
        self._prefill_s += time.perf_counter() - start

    @torch.inference_mode()
    def _prefill_batch(self) -> None:
        donors = self._donors()
        reqs = self._admit_next(donors)
        first, n = len(self.slots), len(reqs)
        starts = self._reuse(reqs, first, donors)
        seqs = [r.input_ids + r.output_ids for r in reqs]  # a retracted request's tokens too
        todo = [q[s:] for q, s in zip(seqs, starts, strict=True)]  # what is not reused
        width = max(len(t) for t in todo)
        # one tensor from padded lists: a copy per row costs more host time than the forward
        ids = torch.tensor([t + [0] * (width - len(t)) for t in todo], dtype=torch.long)
        for r in reqs:
            if not r.output_ids:
                r.start_version = self.weight_version  # the version of its first token
            r.kv_epoch = self._kv_epoch  # its KV, prompt and tokens so far, made now
        lens = [len(q) for q in seqs]
        dev = self.device
        offsets = torch.tensor(starts, device=dev)[:, None]
        pos = (offsets + torch.arange(width, device=dev)[None, :]).clamp(max=self.max_context - 1)
        last = torch.tensor(lens, device=dev) - offsets[:, 0] - 1
        logits = self.decoder.forward(
            self.cache, ids.to(dev), pos, first_slot=first, key_len=max(lens), last=last
        )
        self.slots.extend(reqs)
        self.lens.extend(lens)
        self._sync_rows()
        rows = slice(first, first + n)
        filtering = any(self._filters(r) for r in reqs)
        tokens, logprobs, logp = self._sample(logits, rows, filtering)
        self._tok[rows] = tokens
        self._draw[rows] += 1
        self._count_forward(n, "prefill_forwards")
        self._record(first, tokens, logprobs, logp)

    @torch.inference_mode()
    def _decode(self) -> None:
        start = time.perf_counter()
        if self.overlap:
            self._decode_ahead()
        else:
            if self._dirty:
                self._sync_rows()
            b = len(self.slots)
            tokens, logprobs, logp = self._step(b, max(self.lens) + 1, self._filtering)
            self._count_forward(b, "decode_steps")
            for i in range(b):
                self.lens[i] += 1
            self._record(0, tokens[:b], logprobs[:b], logp[:b])
        self._decode_s += time.perf_counter() - start

    def _decode_ahead(self) -> None:
        """Replay this step, then read the step before it while this one runs: the host's
        per-request work overlaps the device's next step instead of leaving it idle. A row
        that the earlier step finishes has one wasted token in this step (dropped); rows
        that leave make the batch change, so both steps are read before the slots move."""
        if self._dirty:
            self._sync_rows()
        b = len(self.slots)
        key_len = max(self.lens) + 1
        if self.use_graphs:
            tokens, logprobs, logp = self.graphs.replay(b, key_len, self._filtering)
        else:
            tokens, logprobs, logp = self._step(b, key_len, self._filtering)
        self._count_forward(b, "decode_steps")
        for i in range(b):
            self.lens[i] += 1
        if any(r.params.top_logprobs for r in self.slots):  # logp is overwritten by the next
            self._record(0, tokens[:b], logprobs[:b], logp[:b])
            return
        step = self._to_host(tokens[:b], logprobs[:b])
        previous, self._pending = self._pending, step
        if previous is None:
            return
        done = self._append(0, *previous.read(), skip=set())
        if done:
            self._pending = None
            done += self._append(0, *step.read(), skip=set(done))
            self._free(done)

    def _to_host(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> _InFlight:
        """Start copying a step's tokens and logprobs into pinned memory (two buffers, used in
        turn: one step in flight and one being read)."""
        tok, lp, event = self._host_bufs[self._flip]
        self._flip ^= 1
        n = tokens.shape[0]
        tok[:n].copy_(tokens, non_blocking=True)
        lp[:n].copy_(logprobs, non_blocking=True)
        if event is not None:
            event.record()
        return _InFlight(rows=n, tokens=tok, logprobs=lp, event=event)

    def _flush(self) -> None:
        """Read the step in flight (before the batch changes or a command runs)."""
        step, self._pending = self._pending, None
        if step is not None:
            self._free(self._append(0, *step.read(), skip=set()))

    def _drain(self, block: bool) -> bool:
        if self._pending is not None and (block or not self._inbox.empty()):
            self._flush()
        return super()._drain(block)

    def _sample(
        self, logits: torch.Tensor, rows: slice, filtering: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return sample_on_device(
            logits,
            self._temp[rows],
            self._top_p[rows],
            self._top_k[rows],
            self._seed[rows],
            self._draw[rows],
            filtering,
        )

    def _step(
        self, rows: int, key_len: int, filtering: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode step over slots [0, rows), sampling included, device state advanced:
        each running row's sampled token becomes its pending one. Rows past the running ones
        (graph padding) are free slots: they write at the last position of their own slot,
        past any parked prefix (``prefix_pool.py``), and stay there."""
        logits = self.decoder.forward(
            self.cache, self._tok[:rows, None], self._pos[:rows, None], 0, key_len
        )
        tokens, logprobs, logp = self._sample(logits, slice(0, rows), filtering)
        self._tok[:rows] = tokens
        self._pos[:rows] += self._active[:rows]
        self._draw[:rows] += 1
        return tokens, logprobs, logp

    @torch.inference_mode()
    def capture_all(self, filtering: bool = False) -> int:
        """Capture the decode step of every bucket a decode step can ask for (with
        ``filtering`` also their top-k/top-p variants) and run one prefill on each device
        kernel path, before the engine starts: a server's first requests then meet no capture
        (100-300 ms each on an H200 when met mid-traffic). A no-op without CUDA graphs (CPU).
        Returns the number of graphs captured."""
        if not self.use_graphs or self.slots:
            return 0
        n = self.graphs.capture_all(filtering, self._warm_prefill)
        for t in (self.cache.keys, self.cache.values):  # the warm-ups wrote into free slots
            t.zero_()
        return n

    def _warm_prefill(self) -> None:
        """One prefill forward and sampling pass per kernel path (one row, and as many as fit
        one ``max_prefill_tokens`` batch of 64-token prompts) into free slots: CUDA loads each
        kernel on its first launch, and cuBLAS picks its algorithms. Prefill shapes are not
        bucketed and its attention is the memory-efficient kernel, which has no per-shape
        set-up (``decoder._attention_backends``), so there is nothing per shape to warm."""
        width = min(64, self.cache.max_len)
        for n in sorted({1, max(1, min(self.cache.slots, self.cfg.max_prefill_tokens // width))}):
            ids = torch.full((n, width), 5, dtype=torch.long, device=self.device)
            pos = torch.arange(width, device=self.device)[None, :].expand(n, width)
            logits = self.decoder.forward(self.cache, ids, pos, first_slot=0, key_len=width)
            for filtering in (False, True):
                self._sample(logits, slice(0, n), filtering)

    def _filters(self, req: RunnerRequest) -> bool:
        p = req.params
        return 0 < p.top_k < self.vocab_size or p.top_p < 1.0

    def _sync_rows(self) -> None:
        """Rebuild the per-slot device state from the host's view of the running requests."""
        n = self.cache.slots
        # a free slot (a graph's padding row) writes at the last position, where no parked
        # prefix reaches (``_free`` keeps them shorter), and stays there
        toks, draw, seed = [0] * n, [0] * n, [0] * n
        pos = [self.cache.max_len - 1] * n
        top_k = [self.vocab_size] * n  # free slots too (see ``__init__``)
        active = [0] * n
        temp, top_p = [1.0] * n, [1.0] * n
        for i, req in enumerate(self.slots):
            row = req.row
            assert row is not None
            toks[i] = req.output_ids[-1] if req.output_ids else 0
            pos[i], draw[i], seed[i], active[i] = self.lens[i], len(req.output_ids), row.seed, 1
            top_k[i] = row.top_k if 0 < row.top_k < self.vocab_size else self.vocab_size
            temp[i], top_p[i] = row.temperature, row.top_p
        ints = torch.tensor([toks, pos, draw, seed, top_k, active], dtype=torch.long)
        floats = torch.tensor([temp, top_p], dtype=torch.float32)
        ints, floats = ints.to(self.device), floats.to(self.device)
        dsts = (self._tok, self._pos, self._draw, self._seed, self._top_k, self._active)
        for dst, src in zip(dsts, ints, strict=True):
            dst.copy_(src)
        self._temp.copy_(floats[0])
        self._top_p.copy_(floats[1])
        self._filtering = any(self._filters(r) for r in self.slots)
        self._dirty = False

    def _record(
        self, first: int, tokens: torch.Tensor, logprobs: torch.Tensor, logp: torch.Tensor
    ) -> None:
        """Read the sampled tokens of rows [first, first + n) back (one sync), record them,
        finish the rows that are done and free their slots."""
        host = torch.stack((tokens.double(), logprobs.double())).cpu().tolist()
        top: list[tuple[list[float], list[int]]] | None = None
        want = max(r.params.top_logprobs for r in self.slots[first : first + tokens.shape[0]])
        if want > 0:
            values, idx = logp.topk(min(want, self.vocab_size), dim=-1)
            top = list(zip(values.tolist(), idx.tolist(), strict=True))
        tok_ids = [int(t) for t in host[0]]
        self._free(self._append(first, tok_ids, host[1], skip=set(), top=top))

    def _append(
        self,
        first: int,
        tokens: list[int],
        logprobs: list[float],
        skip: set[int],
        top: list[tuple[list[float], list[int]]] | None = None,
    ) -> list[int]:
        """Record one sampled token per row of [first, first + n), except rows in ``skip``
        (already finished); finish the requests that are done and return their rows."""
        done: list[int] = []
        for j, req in enumerate(self.slots[first : first + len(tokens)]):
            if first + j in skip:
                continue
            tok = tokens[j]
            req.output_ids.append(tok)
            req.logprobs.append(logprobs[j])
            k = req.params.top_logprobs
            if k > 0 and top is not None:
                values, idx = top[j]
                req.top.append(list(zip(values[:k], idx[:k], strict=True)))
            if req.on_token is not None:
                req.on_token(tok)
            reason = self._finish_reason(req, tok)
            if reason is not None:
                self._finish(req, reason)
                done.append(first + j)
        self.stats["tokens_generated"] += len(tokens) - len(skip)
        return done

    def _free(self, rows: list[int], park: bool = True) -> None:
        """Release slots ``rows``; move the last running rows into the holes. With ``park``
        (and ``prefix_pool``) the freed rows' KV is kept: a hole and its mover swap slots, so
        every freed row's KV ends in the free region, where the pool records it."""
        if not rows:
            return
        gone = set(rows)
        keep_n = len(self.slots) - len(gone)
        holes = [i for i in sorted(gone) if i < keep_n]
        movers = [i for i in range(keep_n, len(self.slots)) if i not in gone]
        park = park and self.cfg.prefix_pool
        freed = {i: (self.slots[i], self.lens[i]) for i in gone}
        where = {i: i for i in gone}  # freed row -> the slot its KV is in afterwards
        if movers:
            length = max(self.lens[i] for i in movers) + 1
            if park:
                length = max(length, *(self.lens[i] + 1 for i in holes))
                self.cache.move(movers + holes, holes + movers, length)
                where.update(zip(holes, movers, strict=True))
            else:
                self.cache.move(movers, holes, length)
            self.pool.drop(holes)
            for src, dst in zip(movers, holes, strict=True):
                self.slots[dst], self.lens[dst] = self.slots[src], self.lens[src]
        if park:
            for i, slot in where.items():
                req, written = freed[i]
                if req.kv_epoch == self._kv_epoch:  # every token's KV made by these weights
                    seq = req.input_ids + req.output_ids
                    # graph padding rows write at the last position (``_sync_rows``): keep out
                    n = min(written, len(seq), self.cache.max_len - 1)
                    self.pool.park(slot, seq[:n], self._kv_epoch)
                else:
                    self.pool.drop([slot])
        del self.slots[keep_n:], self.lens[keep_n:]
        self._dirty = True


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A decode step's tokens and logprobs on their way to pinned host memory."""

    rows: int
    tokens: torch.Tensor  # (slots,) pinned; the first ``rows`` are this step's
    logprobs: torch.Tensor  # (slots,) pinned
    event: Any  # torch.cuda.Event recorded after the copies; None on CPU (copied already)

    def read(self) -> tuple[list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()
        return self.tokens[: self.rows].tolist(), self.logprobs[: self.rows].tolist()


def build_runner(cfg: ModelRunner.Config) -> ModelRunner:
    """The runner ``cfg.engine`` asks for; ``auto`` is static when the model is one
    ``decoder.py`` runs, dynamic otherwise. (On 2 CPU cores the static engine measured
    2.1-2.3x the dynamic one: ``benchmarks/generation.py --device cpu``.)"""
    if cfg.engine == "dynamic":
        return ModelRunner(cfg)
    if cfg.engine == "static":
        from agentrl.vision import vision_model_type

        kind = vision_model_type(cfg.model)
        if kind is not None:
            raise ConfigError(
                f"the static engine serves text-only decoders; {cfg.model} is a vision-language "
                f"model ({kind}): serve it with --engine dynamic (or auto)."
            )
        return StaticRunner(cfg)
    if cfg.engine != "auto":
        raise ConfigError(f"engine must be auto, static or dynamic, got {cfg.engine!r}.")
    from transformers import AutoConfig

    try:
        check_supported(AutoConfig.from_pretrained(cfg.model))
    except ConfigError as exc:
        logger.info("engine auto -> dynamic: %s", exc)
        return ModelRunner(cfg)
    return StaticRunner(cfg)
