"""The ledger's counting: requests and tokens per minute, concurrency, budgets by calendar, usage."""

from __future__ import annotations

import calendar

import pytest
from hypothesis import given, settings, strategies as st

from app.tenants.headers import anthropic_headers, duration, openai_headers
from app.tenants.ledger import Ledger, Usage, period_of
from app.tenants.policies import KeyPolicy, TokenBudget, key_hash

NOON = float(calendar.timegm((2026, 12, 2, 12, 0, 0)))


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def policy(**limits) -> KeyPolicy:
    return KeyPolicy(name=limits.pop("name", "team"), key_sha256=key_hash("k"), **limits)


def test_requests_per_minute_admit_exactly_the_allowance_then_refill() -> None:
    clock = Clock()
    ledger, p = Ledger(clock), policy(requests_per_minute=6)
    verdicts = [ledger.admit(p) for _ in range(8)]
    assert [v.admitted for v in verdicts] == [True] * 6 + [False] * 2
    refused = verdicts[-1]
    assert refused.reason == "requests" and 9.9 < refused.retry_after_s <= 10.0  # one request per 10 s
    assert refused.limits["requests"].remaining == 0 and refused.limits["requests"].limit == 6
    clock.now += 10
    assert ledger.admit(p).admitted and not ledger.admit(p).admitted


def test_tokens_are_counted_when_settled_and_a_debt_is_bounded() -> None:
    clock = Clock()
    ledger, p = Ledger(clock), policy(tokens_per_minute=600)
    assert ledger.admit(p).admitted
    ledger.settle(p, "m", Usage(1, prompt_tokens=5000, completion_tokens=5000))
    refused = ledger.admit(p)
    assert refused.reason == "tokens" and refused.retry_after_s <= 60.0 + 0.1  # at most a minute's debt
    clock.now += 61
    assert ledger.admit(p).admitted


def test_concurrency_counts_requests_in_flight() -> None:
    ledger, p = Ledger(Clock()), policy(max_concurrent=2)
    assert ledger.admit(p).admitted and ledger.admit(p).admitted
    assert ledger.admit(p).reason == "concurrency"
    ledger.release(p)
    assert ledger.admit(p).admitted
    ledger.settle(p, "m", Usage(1, 1, 0, 1))
    ledger.settle(p, "m", Usage(1, 1, 0, 1))
    ledger.settle(p, "m", Usage(1, 1, 0, 1))  # more settles than admits never go negative
    assert ledger.usage_report()["keys"]["team"]["in_flight"] == 0


def test_a_budget_stops_its_key_until_the_next_calendar_day_and_not_another() -> None:
    clock = Clock()
    ledger = Ledger(clock)
    spender = policy(name="spender", token_budget=TokenBudget(tokens=100, per="day"))
    other = policy(name="other", token_budget=TokenBudget(tokens=100, per="day"))
    assert ledger.admit(spender).admitted
    ledger.settle(spender, "m", Usage(1, 60, 0, 50))
    refused = ledger.admit(spender)
    assert refused.reason == "budget" and abs(refused.retry_after_s - 12 * 3600) < 1
    assert ledger.admit(other).admitted
    clock.now = float(calendar.timegm((2026, 12, 3, 0, 0, 1)))
    assert ledger.admit(spender).admitted


def test_periods_follow_the_utc_calendar() -> None:
    assert period_of("day", NOON) == ("2026-12-02", float(calendar.timegm((2026, 12, 3, 0, 0, 0))))
    assert period_of("month", NOON) == ("2026-12", float(calendar.timegm((2027, 1, 1, 0, 0, 0))))


def test_a_reloaded_policy_keeps_what_was_used() -> None:
    clock = Clock()
    ledger = Ledger(clock)
    before = policy(requests_per_minute=10)
    for _ in range(8):
        assert ledger.admit(before).admitted
    after = before.model_copy(update={"requests_per_minute": 5})
    assert not ledger.admit(after).admitted  # 8 used in the last minute: over the new 5
    raised = before.model_copy(update={"requests_per_minute": 20})
    assert ledger.admit(raised).admitted


def test_usage_survives_in_a_snapshot() -> None:
    clock = Clock()
    ledger, p = Ledger(clock), policy(token_budget=TokenBudget(tokens=1000, per="month"))
    ledger.admit(p)
    ledger.settle(p, "smollm2", Usage(1, 10, 4, 20))
    restored = Ledger(clock)
    restored.restore(ledger.snapshot())
    assert restored.usage_report()["keys"]["team"]["models"]["smollm2"]["requests"] == 1
    restored.admit(p)
    report = restored.usage_report()["keys"]["team"]
    assert report["models"]["smollm2"] == {"requests": 1, "prompt_tokens": 10, "cached_tokens": 4,
                                           "completion_tokens": 20}
    assert report["budget"]["used"] == 30


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "settle", "release", "wait"]),
                          st.integers(min_value=0, max_value=10**7)), max_size=60))
def test_counters_never_go_negative_or_past_their_limits(steps) -> None:
    clock = Clock()
    ledger = Ledger(clock)
    p = policy(requests_per_minute=5, tokens_per_minute=1000, max_concurrent=3)
    admitted_in_window: list[float] = []
    for action, amount in steps:
        if action == "admit":
            verdict = ledger.admit(p)
            if verdict.admitted:
                admitted_in_window.append(clock.now)
            for limit in verdict.limits.values():
                assert 0 <= limit.remaining <= limit.limit
        elif action == "settle":
            ledger.settle(p, "m", Usage(1, amount, 0, 0))
        elif action == "release":
            ledger.release(p)
        else:
            clock.now += amount / 1000.0
        # a bucket never lets more than its allowance plus what refilled through in any minute
        recent = [t for t in admitted_in_window if clock.now - t < 60]
        assert len(recent) <= 5 + 5
        assert 0 <= ledger.usage_report()["keys"].get("team", {}).get("in_flight", 0) <= 3


def test_headers_in_openai_and_anthropic_names() -> None:
    ledger, p = Ledger(Clock()), policy(requests_per_minute=1, tokens_per_minute=100)
    ok = ledger.admit(p)
    headers = openai_headers(ok)
    assert headers["x-ratelimit-limit-requests"] == "1" and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-tokens"] == "100" and "retry-after" not in headers
    refused = ledger.admit(p)
    headers = openai_headers(refused)
    assert headers["retry-after"] == "60" and 59000 <= int(headers["retry-after-ms"]) <= 60000
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    anthropic = anthropic_headers(refused, now=NOON)
    assert anthropic["anthropic-ratelimit-requests-limit"] == "1"
    assert anthropic["anthropic-ratelimit-requests-reset"] == "2026-12-02T12:01:00Z"
    assert anthropic["retry-after"] == "60"
    assert [duration(s) for s in (0.02, 1, 59.2, 360, 3723)] == ["20ms", "1s", "1m0s", "6m0s", "1h2m3s"]


def test_snapshots_round_trip_through_a_file_and_a_url(tmp_path) -> None:
    from app.tenants.snapshots import load_snapshot, save_snapshot

    ledger, p = Ledger(Clock()), policy()
    ledger.admit(p)
    ledger.settle(p, "m", Usage(1, 2, 0, 3))
    for url in (str(tmp_path / "deep" / "usage.json"), "memory://llamaray-test/usage.json"):
        save_snapshot(url, ledger.snapshot())
        assert load_snapshot(url) == ledger.snapshot()
    assert not [f for f in (tmp_path / "deep").iterdir() if f.name.startswith(".usage-")]
    (tmp_path / "bad.json").write_text("{not json")
    assert load_snapshot(str(tmp_path / "bad.json")) == {} and load_snapshot(str(tmp_path / "none.json")) == {}


def test_a_request_never_settled_is_let_go_after_the_hold_so_its_key_is_not_blocked_forever() -> None:
    from app.tenants.ledger import IN_FLIGHT_HOLD_S
    now = [1000.0]
    ledger = Ledger(clock=lambda: now[0])
    p = KeyPolicy(name="team", key_sha256=key_hash("k"), max_concurrent=1)
    assert ledger.admit(p).admitted
    assert not ledger.admit(p).admitted  # the replica that admitted the first died: no settle comes
    now[0] += IN_FLIGHT_HOLD_S + 1
    assert ledger.admit(p).admitted


@pytest.mark.parametrize("bad", [
    {"usage": {"team": {"m": {"requests": 1, "bogus": 2}}}},   # a field a snapshot never holds
    {"usage": {"team": {"m": {"requests": -5}}}},              # negative
    {"usage": {"team": {"m": {"requests": 1.5}}}},             # not a whole number
    {"usage": {"team": {"m": {"requests": True}}}},            # a bool is no count
    {"usage": {"team": {"m": {"requests": 10**30}}}},          # past any real count
    {"usage": {"team": "many"}, "budgets": {"team": [1]}},     # wrong shapes
    {"usage": ["team"], "budgets": ["team"]},
    {"budgets": {"team": ["2026-12-02", float("nan"), 5]}},    # a non-finite time
    {"budgets": {"team": ["2026-12-02", 1e18, -1]}},
])
def test_a_damaged_snapshot_is_skipped_entry_by_entry_never_crashing_the_ledger(bad) -> None:
    good = {"usage": {"other": {"m": {"requests": 2, "prompt_tokens": 7, "cached_tokens": 0, "completion_tokens": 3}}}}
    ledger = Ledger()
    ledger.restore({**bad, "usage": {**good["usage"], **(bad.get("usage") if isinstance(bad.get("usage"), dict)
                                                         else {})}})
    report = ledger.usage_report()["keys"]
    assert report["other"]["models"]["m"] == good["usage"]["other"]["m"]  # the rest restored
    assert "team" not in report and "team" not in ledger._restored_budgets  # nothing of the damaged entries
