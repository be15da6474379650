"""The bounded response store: bounds by entries and by bytes, expiry on an injected clock, least recently
used out, one owner's entries invisible to another, delete, and an entry larger than the whole store."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.config.app_args import Limits
from app.openai_responses.store import BoundedResponseStore, MemoryResponseStore, encode_entry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(text: str = "hi", pad: int = 0) -> dict:
    return {"response": {"id": "resp_x", "object": "response", "output_text": text + "x" * pad},
            "conversation": [{"role": "user", "content": text}]}


def run(coro):
    return asyncio.run(coro)


def store(entries: int = 100, nbytes: int = 1 << 20, ttl: float = 60.0, clock: Clock | None = None):
    return BoundedResponseStore(entries, nbytes, ttl, clock=clock or Clock())


def ids(s: BoundedResponseStore, owner: str | None, candidates) -> list[str]:
    return [rid for rid in candidates if run(s.get(owner, rid)) is not None]


def test_round_trip_is_a_copy():
    s = store()
    e = entry("héllo ☃")
    assert run(s.put("a", "r1", e)) is True
    got = run(s.get("a", "r1"))
    assert got == e
    got["response"]["output_text"] = "changed"
    assert run(s.get("a", "r1")) == e  # what a reader does to its copy stays there


def test_bound_on_entries_drops_least_recently_used():
    s = store(entries=3)
    for rid in ("r1", "r2", "r3"):
        run(s.put("a", rid, entry(rid)))
    assert run(s.get("a", "r1")) is not None  # read: r1 is now the most recently used, r2 the least
    run(s.put("a", "r4", entry("r4")))
    assert ids(s, "a", ["r1", "r2", "r3", "r4"]) == ["r1", "r3", "r4"]
    assert len(s) == 3 and s.stats()["evicted"] == 1


def test_rewrite_counts_as_use_and_does_not_grow():
    s = store(entries=2)
    run(s.put("a", "r1", entry("one")))
    run(s.put("a", "r2", entry("two")))
    run(s.put("a", "r1", entry("one again")))  # replaces r1, which becomes the most recent
    assert len(s) == 2
    run(s.put("a", "r3", entry("three")))
    assert ids(s, "a", ["r1", "r2", "r3"]) == ["r1", "r3"]
    assert run(s.get("a", "r1"))["conversation"][0]["content"] == "one again"


def test_bound_on_bytes_counts_compact_json():
    one = len(encode_entry(entry("r0", pad=300)))
    s = store(nbytes=3 * one)
    for i in range(3):
        run(s.put("a", f"r{i}", entry(f"r{i}", pad=300)))
    assert s.nbytes == 3 * one and len(s) == 3  # exactly at the bound: all kept
    run(s.put("a", "r3", entry("r3", pad=300)))
    assert ids(s, "a", ["r0", "r1", "r2", "r3"]) == ["r1", "r2", "r3"]
    assert s.nbytes == 3 * one
    # A larger entry pushes out as many of the least recently used as it needs.
    run(s.put("a", "big", entry("big", pad=300 + one - 50)))
    assert ids(s, "a", ["r1", "r2", "r3", "big"]) == ["r3", "big"]
    assert s.nbytes <= 3 * one


def test_entry_larger_than_the_store_is_refused_and_logged(caplog):
    small = len(encode_entry(entry("r1")))
    s = store(nbytes=small + 10)
    run(s.put("a", "r1", entry("r1")))
    run(s.put("a", "huge", entry("hi", pad=100)))  # evicts nothing it cannot replace
    with caplog.at_level(logging.WARNING, logger="llamaray.responses"):
        assert run(s.put("a", "r1", entry("r1", pad=100))) is False
    assert "r1" in caplog.text and "not stored" in caplog.text
    # The older version of r1 is not served in place of the refused one.
    assert run(s.get("a", "r1")) is None
    assert s.stats()["refused"] == 2 and s.nbytes == 0 and len(s) == 0


def test_entries_expire_after_ttl_from_their_last_write():
    clock = Clock()
    s = store(ttl=60, clock=clock)
    run(s.put("a", "r1", entry()))
    clock.now += 30
    run(s.put("a", "r2", entry()))
    clock.now += 29.9
    assert run(s.get("a", "r1")) is not None  # a read does not extend its life
    clock.now += 0.1  # r1 written 60 s ago
    assert run(s.get("a", "r1")) is None
    assert run(s.get("a", "r2")) is not None
    assert run(s.delete("a", "r1")) is False
    clock.now += 30
    assert run(s.get("a", "r2")) is None
    assert len(s) == 0 and s.nbytes == 0


def test_rewrite_restarts_the_ttl():
    clock = Clock()
    s = store(ttl=60, clock=clock)
    run(s.put("a", "r1", entry()))
    run(s.put("a", "r2", entry()))
    clock.now += 50
    run(s.put("a", "r1", entry("again")))
    clock.now += 20
    assert ids(s, "a", ["r1", "r2"]) == ["r1"]


def test_owners_are_isolated():
    s = store()
    run(s.put("key-a", "r1", entry("a's")))
    assert run(s.get("key-b", "r1")) is None
    assert run(s.get(None, "r1")) is None
    assert run(s.delete("key-b", "r1")) is False  # and it cannot delete it either
    assert run(s.get("key-a", "r1"))["conversation"][0]["content"] == "a's"
    run(s.put("key-b", "r1", entry("b's")))  # the same id under another owner is another entry
    assert run(s.get("key-a", "r1"))["conversation"][0]["content"] == "a's"
    assert run(s.get("key-b", "r1"))["conversation"][0]["content"] == "b's"


def test_delete():
    s = store()
    run(s.put("a", "r1", entry()))
    n = s.nbytes
    assert n > 0
    assert run(s.delete("a", "r1")) is True
    assert run(s.get("a", "r1")) is None
    assert run(s.delete("a", "r1")) is False
    assert s.nbytes == 0 and len(s) == 0


def test_zero_entries_stores_nothing():
    s = store(entries=0)
    assert run(s.put("a", "r1", entry())) is False
    assert run(s.get("a", "r1")) is None


def test_resize_applies_new_bounds_at_once():
    clock = Clock()
    s = store(entries=10, ttl=600, clock=clock)
    for i in range(5):
        run(s.put("a", f"r{i}", entry()))
        clock.now += 10
    s.resize(3, 1 << 20, 600)
    assert ids(s, "a", [f"r{i}" for i in range(5)]) == ["r2", "r3", "r4"]
    s.resize(3, 1 << 20, 25)  # r2 and r3 were written 30 and 20 s ago
    assert ids(s, "a", ["r2", "r3", "r4"]) == ["r3", "r4"]
    with pytest.raises(ValueError):
        s.resize(-1, 10, 1)


def test_defaults_come_from_limits():
    limits = Limits()
    s = MemoryResponseStore()
    assert (s.max_entries, s.max_bytes, s.ttl_s) == (limits.response_store_entries, limits.response_store_bytes,
                                                      limits.response_store_ttl_s)
    assert limits.response_store_entries > 0 and limits.response_store_ttl_s >= 3600
    assert Limits(response_store_entries=0).response_store_entries == 0
    with pytest.raises(ValueError):
        Limits(response_store_ttl_s=0)
