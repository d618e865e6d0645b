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
