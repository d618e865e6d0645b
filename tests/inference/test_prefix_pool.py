"""The prefix pool's bookkeeping (no model): which free slot holds which finished prefix,
longest-prefix lookup keyed by weight version, and moving entries out of slots a prefill
needs, least recently used giving way first."""

from __future__ import annotations

import random

from agentrl.inference.prefix_pool import MIN_SHARED, PrefixPool, common_prefix


def _seq(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_common_prefix_equals_a_plain_loop_on_random_lists() -> None:
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 60))]
        b = a[: rng.randrange(0, len(a) + 1)] + [
            rng.randrange(3) for _ in range(rng.randrange(0, 20))
        ]
        want = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix(a, b) == want
        assert common_prefix(b, a) == want


def test_best_is_the_longest_shared_prefix_of_this_weight_version() -> None:
    pool = PrefixPool()
    turn1 = _seq(40)
    pool.park(7, turn1, version=3)
    pool.park(8, turn1[:20] + [1] * 30, version=3)  # a group-mate: same head, other answer
    pool.park(9, [*turn1, 5, 6], version=2)  # longer, but made by older weights
    turn2 = [*turn1, 5, 6, 7, 8]
    assert pool.best(turn2, version=3) == (7, 40)
    assert pool.best(turn2, version=2) == (9, 42)
    assert pool.best(turn2, version=4) == (-1, 0)
    assert pool.best([1] * 40, version=3) == (-1, 0)  # another head
    pool.park(10, _seq(MIN_SHARED - 1), version=3)  # too short to be worth a copy
    assert 10 not in pool.entries
    pool.clear()
    assert pool.best(turn2, version=3) == (-1, 0)


def test_evacuate_moves_entries_up_then_evicts_the_least_recently_used() -> None:
    pool = PrefixPool()
    for slot, start in ((2, 0), (3, 1000), (6, 2000), (7, 3000)):
        pool.park(slot, _seq(30, start), version=0)
    pool.best(_seq(32, 2000), version=0)  # slot 6 used just now: most recent
    # a prefill writes slots [2, 4); free above it: 4..7, of which 4 and 5 are empty; the
    # most recent leaving entry takes the highest empty slot
    src, dst = pool.evacuate(2, 4, free=[4, 5, 6, 7])
    assert (src, dst) == ([3, 2], [5, 4])
    assert set(pool.entries) == {4, 5, 6, 7} and pool.evicted == 0
    assert pool.best(_seq(32, 0), version=0) == (4, 30)  # the entry moved with its slot
    # nothing is empty now: a leaving entry may only replace one used less recently (slot 7,
    # not slot 6); the entry from slot 5 is older than both and goes
    src, dst = pool.evacuate(4, 6, free=[6, 7])
    assert (src, dst, pool.evicted) == ([4], [7], 2)
    assert set(pool.entries) == {6, 7}
    assert pool.best(_seq(32, 0), version=0) == (7, 30)
    assert pool.best(_seq(32, 2000), version=0) == (6, 30)
    assert pool.best(_seq(32, 3000), version=0) == (-1, 0)  # evicted
    pool.drop([6, 7])
    assert len(pool) == 0


class _BruteForcePool(PrefixPool):
    """The pool's specification, by scanning every entry (what the head index must equal)."""

    def best(self, tokens: list[int], version: int | None) -> tuple[int, int]:
        shared = {
            s: common_prefix(tokens, e.tokens)
            for s, e in self.entries.items()
            if e.version == version and e.tokens[:MIN_SHARED] == tokens[:MIN_SHARED]
        }
        recent = sorted(shared, key=lambda s: self.entries[s].stamp, reverse=True)[:32]
        slot = max(recent, key=lambda s: shared[s], default=-1)  # the most recent of the longest
        if slot < 0 or shared[slot] < MIN_SHARED:
            return -1, 0
        self.entries[slot].stamp = self._tick()
        return slot, shared[slot]

    def evacuate(self, lo: int, hi: int, free: list[int]) -> tuple[list[int], list[int]]:
        src: list[int] = []
        dst: list[int] = []
        for s in sorted(
            (s for s in self.entries if lo <= s < hi), key=lambda s: -self.entries[s].stamp
        ):
            entry = self._pop(s)
            assert entry is not None
            empty = [t for t in sorted(free, reverse=True) if t not in self.entries]
            older = [t for t in free if t in self.entries and self.entries[t].stamp < entry.stamp]
            if empty:
                to = empty[0]
            elif older:
                to = min(older, key=lambda t: self.entries[t].stamp)
                self._pop(to)
                self.evicted += 1
            else:
                self.evicted += 1
                continue
            self._put(to, entry)
            src.append(s)
            dst.append(to)
        return src, dst


def test_the_head_index_answers_as_a_scan_of_every_entry_would() -> None:
    """Random parks, drops, lookups and evacuations (heads that collide, two weight versions,
    full pools) give the same answers, entries and evictions as the brute-force scan."""
    rng = random.Random(1)
    fast, slow = PrefixPool(), _BruteForcePool()
    heads = [[rng.randrange(4) for _ in range(MIN_SHARED)] for _ in range(3)]

    def tokens() -> list[int]:
        return rng.choice(heads) + [rng.randrange(3) for _ in range(rng.randrange(0, 12))]

    slots = 24
    for step in range(3000):
        op = rng.random()
        if op < 0.4:
            slot, toks, version = rng.randrange(slots), tokens(), rng.randrange(2)
            fast.park(slot, toks, version)
            slow.park(slot, toks, version)
        elif op < 0.7:
            query, version = tokens() + [rng.randrange(3) for _ in range(4)], rng.randrange(2)
            assert fast.best(query, version) == slow.best(query, version), step
        elif op < 0.95:
            lo = rng.randrange(slots)
            hi = rng.randrange(lo, slots + 1)
            free = [s for s in range(hi, slots) if rng.random() < 0.8]
            assert fast.evacuate(lo, hi, free) == slow.evacuate(lo, hi, free), step
        elif op < 0.99:
            gone = rng.sample(range(slots), 3)
            fast.drop(gone)
            slow.drop(gone)
        else:
            fast.clear()
            slow.clear()
        assert {s: (e.tokens, e.version, e.stamp) for s, e in fast.entries.items()} == {
            s: (e.tokens, e.version, e.stamp) for s, e in slow.entries.items()
        }, step
        assert fast.evicted == slow.evicted
