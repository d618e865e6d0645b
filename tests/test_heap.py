"""agentrl.heap: freezing the start-up heap and timing the collector's passes."""

from __future__ import annotations

import gc
import weakref

import pytest

from agentrl import heap


def test_freeze_takes_live_objects_out_of_later_passes() -> None:
    keep = [[i] for i in range(20_000)]  # tracked containers, alive through the freeze
    try:
        frozen = heap.freeze()
        # a frozen object can still be freed by reference counting (by any thread of the
        # process), so the count may fall after the freeze, never rise
        assert len(keep) <= gc.get_freeze_count() <= frozen
        assert heap.pauses()["gc_frozen_objects"] == frozen  # counted at the freeze
        # a full pass now walks only what was made since: the frozen lists are not in it
        assert not any(o is keep[0] for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_the_environment_can_turn_freezing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_GC_FREEZE", "0")
    assert heap.freeze() == 0 and gc.get_freeze_count() == 0


def test_watch_times_each_generation_once_registered() -> None:
    heap.watch()
    heap.watch()  # idempotent: one callback, not two
    assert gc.callbacks.count(heap._on_gc) == 1
    before = heap.pauses()
    gc.collect(2)
    gc.collect(0)
    after = heap.pauses()
    assert after["gc_gen2_passes"] == before["gc_gen2_passes"] + 1
    assert after["gc_gen0_passes"] >= before["gc_gen0_passes"] + 1
    assert after["gc_gen2_s"] > before["gc_gen2_s"] and after["gc_gen2_max_s"] > 0
    gc.callbacks.remove(heap._on_gc)


def test_frozen_releases_the_heap_after_its_block() -> None:
    """A training run inside someone else's process (a test, a notebook) leaves nothing
    frozen: a cycle that was alive during the block is collected once it ends."""

    class Node:
        pass

    node = Node()
    node.me = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    gone = weakref.ref(node)
    with heap.frozen() as count:
        assert count > 0 and gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert gone() is not None  # frozen: the collector does not look at it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None
