"""The collector's pace in a serving replica (app/ops/gc_tuning.py): thousands of live short-lived containers
start no collection, and reference cycles are still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from app.ops.gc_tuning import YOUNG_THRESHOLD, gc_info, tune_for_serving


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def young_collections() -> int:
    return gc.get_stats()[0]["collections"]


def test_tuning_sets_the_young_threshold_and_keeps_the_older_ratios(thresholds):
    gc.set_threshold(700, 7, 9)
    tune_for_serving()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
    assert gc_info()["threshold"] == [YOUNG_THRESHOLD, 7, 9]
    assert len(gc_info()["collections"]) == 3


def test_many_live_chunks_start_no_collection_when_tuned(thresholds):
    """1,000 chunk-like dicts (4,000 containers) alive at once, a moment of many streams: Python's threshold
    collects, ours does not."""
    def burst() -> int:
        gc.collect()
        before = young_collections()
        live = [{"choices": [{"delta": {"content": "x"}}]} for _ in range(1000)]
        after = young_collections()
        del live
        return after - before

    gc.set_threshold(700, 10, 10)
    assert burst() > 0
    tune_for_serving()
    assert burst() == 0


def test_reference_cycles_are_still_collected_when_tuned(thresholds):
    """What the collector is for still happens without gc.collect(): the tuning slows it, never turns it off."""
    tune_for_serving()
    gc.collect()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None  # a cycle: reference counting alone cannot free it
    kept = []
    # Net allocations past the threshold start a young collection (up to 12 of them, should something else
    # running in this process have collected first and aged the cycle into an older generation).
    while gone() is not None and len(kept) < 12 * YOUNG_THRESHOLD:
        kept.extend([] for _ in range(YOUNG_THRESHOLD // 4))
    assert gone() is None
