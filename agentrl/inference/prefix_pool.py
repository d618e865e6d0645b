"""Finished requests' KV kept in free slots, so the next turn of a conversation skips it.

    a request finishes in slot s -> PrefixPool.park(s, its tokens, weights epoch)
    a new request arrives        -> PrefixPool.best(prompt, epoch) -> (slot, shared tokens)
                                    -> the shared prefix is copied into the new slot, only the
                                       rest of the prompt is prefilled
    a prefill is about to write slots [lo, hi) -> PrefixPool.evacuate(lo, hi, free slots)
                                    -> parked entries there move to free slots above (or go)
    weights change               -> PrefixPool.clear()

An agent's turn k + 1 repeats turn k's prompt and answer, then adds the tool's output: without
this, every turn prefills the whole conversation again. The static engine keeps running rows
packed at slots [0, B), so free slots are [B, S); a parked entry lives in one of them until a
prefill needs the slot (it is then moved higher up if there is room, least recently used
entries giving way first) or the weights change (the pool is keyed by the weights' epoch,
which the static engine bumps at every update, with or without a new version: KV made by
older weights is never reused). Host bookkeeping only: the slot copies are the caller's
(``SlotCache.move``), so this module is plain Python and tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SHARED = 16
"""Shortest shared prefix worth a copy (the same bar as running-slot reuse)."""
MAX_CANDIDATES = 32
"""Entries compared per request (most recently parked first): a GRPO group's members share
their first tokens, so the head alone does not pick the right one."""


@dataclass(slots=True)
class _Entry:
    tokens: list[int]  # the tokens whose KV the slot holds, positions [0, len)
    version: int | None
    stamp: int  # parking order: higher is more recent


class PrefixPool:
    """Which free slots hold which finished token prefixes (keyed by their first tokens).

    ``entries`` is read-only outside this class: every change goes through a method, which
    keeps the index by first tokens (``_heads``) in step, so a lookup compares only the
    entries that start like the prompt, never every parked slot (a GRPO step parks hundreds)."""

    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}
        self._heads: dict[tuple[int, ...], set[int]] = {}  # first MIN_SHARED tokens -> slots
        self._clock = 0
        self.parked = 0  # entries ever parked
        self.evicted = 0  # entries dropped to make room (not counting ``clear``)

    def __len__(self) -> int:
        return len(self.entries)

    def park(self, slot: int, tokens: list[int], version: int | None) -> None:
        """Slot ``slot`` (free now) holds the KV of ``tokens`` made by weights ``version``
        (the static engine passes its weights epoch)."""
        self._pop(slot)
        if len(tokens) < MIN_SHARED:
            return
        self._clock += 1
        self._put(slot, _Entry(list(tokens), version, self._clock))
        self.parked += 1

    def drop(self, slots: range | list[int]) -> None:
        """These slots are about to be written (a prefill or a running row moves in)."""
        for s in slots:
            self._pop(s)

    def clear(self) -> None:
        self.entries.clear()
        self._heads.clear()

    def best(self, tokens: list[int], version: int | None) -> tuple[int, int]:
        """(slot, shared prefix length) of the entry sharing the longest prefix with
        ``tokens`` made by weights ``version``; (-1, 0) when none shares ``MIN_SHARED``."""
        if len(tokens) < MIN_SHARED:
            return -1, 0
        slots = self._heads.get(tuple(tokens[:MIN_SHARED]), ())
        found = sorted(
            ((self.entries[s].stamp, s) for s in slots if self.entries[s].version == version),
            reverse=True,
        )[:MAX_CANDIDATES]
        best, slot = 0, -1
        for _stamp, s in found:
            shared = common_prefix(tokens, self.entries[s].tokens)
            if shared > best:
                best, slot = shared, s
        if best < MIN_SHARED:
            return -1, 0
        self.entries[slot].stamp = self._tick()  # used: the least recently used give way first
        return slot, best

    def evacuate(self, lo: int, hi: int, free: list[int]) -> tuple[list[int], list[int]]:
        """Before slots [lo, hi) are written: move their entries to slots of ``free`` (free
        slots outside [lo, hi), the caller's); the most recent entries move first, into
        empty slots, then over less recent entries. Returns the copies to make (src, dst);
        entries with nowhere to go are dropped."""
        leaving = sorted(
            (s for s in self.entries if lo <= s < hi),
            key=lambda s: self.entries[s].stamp,
            reverse=True,
        )
        if not leaving:
            return [], []
        empty = [s for s in sorted(free, reverse=True) if s not in self.entries]
        # entries that may be written over, least recent first; a leaving entry comes in more
        # recent than every later (less recent) one, so it is never a victim of those
        victims = sorted((self.entries[t].stamp, t) for t in free if t in self.entries)
        src: list[int] = []
        dst: list[int] = []
        v = 0
        for s in leaving:
            entry = self._pop(s)
            assert entry is not None
            if empty:
                to = empty.pop(0)
            elif v < len(victims) and victims[v][0] < entry.stamp:
                to = victims[v][1]
                v += 1
                self._pop(to)
                self.evicted += 1
            else:
                self.evicted += 1
                continue
            self._put(to, entry)
            src.append(s)
            dst.append(to)
        return src, dst

    def _put(self, slot: int, entry: _Entry) -> None:
        self.entries[slot] = entry
        self._heads.setdefault(tuple(entry.tokens[:MIN_SHARED]), set()).add(slot)

    def _pop(self, slot: int) -> _Entry | None:
        entry = self.entries.pop(slot, None)
        if entry is not None:
            head = tuple(entry.tokens[:MIN_SHARED])
            slots = self._heads[head]
            slots.discard(slot)
            if not slots:
                del self._heads[head]
        return entry

    def _tick(self) -> int:
        self._clock += 1
        return self._clock


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``. List slices compare in C: a
    whole-prefix check first (a conversation's next turn contains the previous one), then a
    binary search, instead of a Python loop over thousands of tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
