"""Which idle slot the engine gives a new prompt (KVPlacement.place), on an engine whose decode thread
is not started: the slots' token records are set by hand (their KV is empty, which _place only trims),
so each case states exactly what every slot holds."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from app.engine.kv_placement import MIN_COPY_TOKENS
from app.engine.slots import SlotState

HEADER = list(range(1000, 1024))  # a chat template's first lines: every prompt starts with them


@pytest.fixture(scope="module")
def idle_engine(bundled_spec):
    from app.engine import LlamaEngine

    engine = LlamaEngine(dataclasses.replace(bundled_spec, n_seq_max=4, prompt_cache_mib=0))  # not started
    yield engine
    engine.close()


def place(engine, holds: list[list[int]], busy: set[int], prompt: list[int], batch_lines: set[int] = frozenset(),
          batch: bool = False) -> int:
    """The slot `prompt` goes to; `busy` slots generate, those of them in `batch_lines` for batch lines."""
    for slot, tokens in zip(engine.slots, holds):
        slot.tokens = list(tokens)
        slot.state = SlotState.GENERATING if slot.index in busy else SlotState.IDLE
        slot.gen = SimpleNamespace(req=SimpleNamespace(batch=slot.index in batch_lines)) if slot.index in busy else None
    try:
        return engine.placement.place(prompt, "", batch=batch)[0].index
    finally:
        for slot in engine.slots:
            slot.tokens, slot.state, slot.gen = [], SlotState.IDLE, None


def test_lowest_idle_slot_keeps_busy_slots_packed(idle_engine):
    # Slot 3 shares 3 more tokens with the prompt than slot 1: not worth a gap in the packing.
    holds = [HEADER + [1], HEADER + [2], HEADER + [3], HEADER + [7, 8, 9, 4]]
    assert place(idle_engine, holds, busy={0}, prompt=HEADER + [7, 8, 9, 5, 6]) == 1


def test_an_idle_slot_holding_a_real_prefix_is_taken(idle_engine):
    history = list(range(5000, 5000 + MIN_COPY_TOKENS + 10))
    holds = [HEADER + [1], HEADER + [2], HEADER + [3], HEADER + history]
    assert place(idle_engine, holds, busy={0}, prompt=HEADER + history + [42]) == 3


def test_batch_lines_fill_the_slots_from_the_top_and_interactive_requests_stay_below_them(idle_engine):
    """Batch lines beside interactive requests get few of a step's rows: interactive sequences among their slots
    would each decode as a run of its own (app/engine/kv_placement.py)."""
    history = list(range(5000, 5000 + MIN_COPY_TOKENS + 10))
    holds = [HEADER + [1], HEADER + [2], HEADER + history, HEADER + [3]]
    assert place(idle_engine, holds, busy=set(), prompt=HEADER + [9], batch=True) == 3
    assert place(idle_engine, holds, busy={3}, batch_lines={3}, prompt=HEADER + [9], batch=True) == 2
    # Slot 2 holds the prompt's prefix, but above a batch line's slot: the lowest idle slot takes it (copied).
    assert place(idle_engine, holds, busy={1}, batch_lines={1}, prompt=HEADER + history + [42]) == 0
    # Below every batch line it is taken, as without batch lines.
    assert place(idle_engine, holds, busy={3}, batch_lines={3}, prompt=HEADER + history + [42]) == 2
