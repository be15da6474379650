"""Fair share: who gets the next slot when requests wait."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, strategies as st

from app.tenants.fair_share import fair_order


def order(waiting, running=None, weights=None):
    weights = weights or {}
    return fair_order(waiting, lambda r: r[0], lambda r: weights.get(r[0], 1.0), Counter(running or {}))


def test_a_key_with_many_waiting_does_not_starve_one_that_came_later() -> None:
    waiting = [("greedy", i) for i in range(16)] + [("polite", 0)]
    assert order(waiting, running={"greedy": 4})[0] == ("polite", 0)
    assert order(waiting)[:3] == [("greedy", 0), ("polite", 0), ("greedy", 1)]  # equals: oldest first


def test_weights_share_slots_in_proportion() -> None:
    waiting = [("high", i) for i in range(8)] + [("low", i) for i in range(8)]
    first_six = order(waiting, weights={"high": 2.0, "low": 1.0})[:6]
    assert Counter(t for t, _ in first_six) == {"high": 4, "low": 2}


def test_a_request_for_several_slots_counts_them_all() -> None:
    waiting = [("wide", 4), ("wide", 1), ("narrow", 1), ("narrow", 1)]
    by_slots = fair_order(waiting, lambda r: r[0], lambda r: 1.0, size_of=lambda r: r[1])
    assert by_slots == [("wide", 4), ("narrow", 1), ("narrow", 1), ("wide", 1)]
    assert order(waiting) == [("wide", 4), ("narrow", 1), ("wide", 1), ("narrow", 1)]


def test_with_one_key_it_is_first_come_first_served() -> None:
    waiting = [("only", i) for i in range(5)]
    assert order(waiting, running={"only": 3}) == waiting


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers()), max_size=40),
       st.dictionaries(st.sampled_from("abc"), st.integers(min_value=0, max_value=10)))
def test_every_waiting_request_comes_out_once_and_in_order_within_its_key(waiting, running) -> None:
    out = order(waiting, running)
    assert sorted(map(repr, out)) == sorted(map(repr, waiting))
    for key in "abc":
        assert [r for r in out if r[0] == key] == [r for r in waiting if r[0] == key]
