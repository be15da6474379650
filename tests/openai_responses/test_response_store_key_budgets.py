"""Each API key's budget in the response store: a key's writes evict its own entries, never another's that
holds no more than its share, and the store's own bounds take from the key holding the most."""

from __future__ import annotations

import asyncio
import logging

from app.config.app_args import Limits
from app.openai_responses.store import BoundedResponseStore, MemoryResponseStore, encode_entry


def entry(text: str = "hi", pad: int = 0) -> dict:
    return {"response": {"id": "resp_x", "output_text": text + "x" * pad}, "conversation": []}


def put(s, owner, rid, pad=0):
    return asyncio.run(s.put(owner, rid, entry(rid, pad)))


def kept(s, owner, rids) -> list[str]:
    return [rid for rid in rids if asyncio.run(s.get(owner, rid)) is not None]


ONE = len(encode_entry(entry("a00", pad=1000)))


def test_a_flooding_key_evicts_only_its_own_entries():
    s = BoundedResponseStore(100, 10 * ONE, 60, key_entries=100, key_bytes=3 * ONE)
    put(s, "b", "b00", pad=1000)
    put(s, "c", "c00", pad=1000)
    flood = [f"a{i:02d}" for i in range(50)]
    for rid in flood:
        put(s, "a", rid, pad=1000)
    assert kept(s, "a", flood) == flood[-3:]  # its budget, least recently used out
    assert kept(s, "b", ["b00"]) == ["b00"] and kept(s, "c", ["c00"]) == ["c00"]
    assert s.owner_stats("a") == {"entries": 3, "bytes": 3 * ONE}


def test_a_key_budget_of_entries():
    s = BoundedResponseStore(100, 1 << 20, 60, key_entries=2)
    put(s, "b", "b1")
    for rid in ("a1", "a2", "a3"):
        put(s, "a", rid)
    assert asyncio.run(s.get("a", "a2")) is not None  # a read is a use: a3 is now a's least recent
    put(s, "a", "a4")
    assert kept(s, "a", ["a1", "a2", "a3", "a4"]) == ["a2", "a4"]
    assert kept(s, "b", ["b1"]) == ["b1"]


def test_the_store_bound_takes_from_the_key_holding_the_most():
    # Budgets that add up past the store: when it is full, the largest holder loses, not the least recent.
    s = BoundedResponseStore(100, 6 * ONE, 60, key_bytes=4 * ONE)
    put(s, "b", "b00", pad=1000)
    put(s, "c", "c00", pad=1000)
    for i in range(4):
        put(s, "a", f"a0{i}", pad=1000)  # a: 4, the store: 6 = full
    put(s, "c", "c01", pad=1000)  # past the store: a holds the most, its least recent goes
    assert kept(s, "a", ["a00", "a01", "a02", "a03"]) == ["a01", "a02", "a03"]
    assert kept(s, "b", ["b00"]) == ["b00"] and kept(s, "c", ["c00", "c01"]) == ["c00", "c01"]
    assert s.nbytes == 6 * ONE


def test_the_store_entry_bound_takes_from_the_key_holding_the_most_entries():
    s = BoundedResponseStore(4, 1 << 20, 60)
    put(s, "b", "b0")
    for i in range(5):
        put(s, "a", f"a{i}")
    assert kept(s, "b", ["b0"]) == ["b0"] and len(s) == 4
    assert kept(s, "a", [f"a{i}" for i in range(5)]) == ["a2", "a3", "a4"]


def test_a_key_within_its_fair_share_is_never_evicted_by_others():
    # 5 keys over a store of 10 entries: 2 each is a fair share. Four keys write 40 each; the fifth's two stay.
    s = BoundedResponseStore(10, 1 << 20, 60)
    put(s, "quiet", "q0")
    put(s, "quiet", "q1")
    for i in range(40):
        for owner in ("w", "x", "y", "z"):
            put(s, owner, f"{owner}{i}")
    assert kept(s, "quiet", ["q0", "q1"]) == ["q0", "q1"] and len(s) == 10


def test_an_entry_past_the_key_budget_is_refused_and_logged(caplog):
    s = BoundedResponseStore(100, 10 * ONE, 60, key_bytes=ONE)
    assert put(s, "a", "a00", pad=1000) is True
    with caplog.at_level(logging.WARNING, logger="llamaray.responses"):
        assert put(s, "a", "a01", pad=2000) is False
    assert "response_store_key_bytes" in caplog.text
    assert kept(s, "a", ["a00", "a01"]) == ["a00"] and s.stats()["refused"] == 1


def test_no_key_has_only_the_store_bounds():
    # A server without API keys: every caller is owner None, one caller, so the key budget does not apply.
    s = BoundedResponseStore(100, 10 * ONE, 60, key_entries=1, key_bytes=ONE)
    for i in range(5):
        assert put(s, None, f"n{i}", pad=1000) is True
    assert len(kept(s, None, [f"n{i}" for i in range(5)])) == 5


def test_resize_applies_key_budgets_at_once():
    s = BoundedResponseStore(100, 1 << 20, 60)
    for i in range(5):
        put(s, "a", f"a{i}")
    put(s, "b", "b0")
    s.resize(100, 1 << 20, 60, key_entries=2)
    assert kept(s, "a", [f"a{i}" for i in range(5)]) == ["a3", "a4"] and kept(s, "b", ["b0"]) == ["b0"]
    assert s.stats()["key_entries"] == 2 and s.stats()["owners"] == 2


def test_key_budgets_come_from_limits():
    limits = Limits()
    s = MemoryResponseStore()
    assert (s.key_entries, s.key_bytes) == (limits.response_store_key_entries, limits.response_store_key_bytes)
    # A key's share is smaller than the store, so one key cannot fill it alone.
    assert limits.response_store_key_bytes < limits.response_store_bytes
    assert limits.response_store_key_entries < limits.response_store_entries
    s = BoundedResponseStore.from_limits(Limits(response_store_key_entries=7, response_store_key_bytes=4096))
    assert (s.key_entries, s.key_bytes) == (7, 4096)
