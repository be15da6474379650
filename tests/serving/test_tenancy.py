"""The tenant gate on the processing's path (app/serving/tenancy.py): a refusal is a 429 in the protocol's
shape with the headers its SDK reads, raised before a stream's first item; a request's ticket is settled
with the usage its record says, however it ended; a count is not metered; a server without keys is not."""

from __future__ import annotations

import asyncio

import pytest

from app.api.errors import APIError
from app.generation.caller import ANONYMOUS, Caller
from app.observe.request_records import NullObserver, RequestRecord
from app.serving.reply_headers import WithHeaders, split_headers
from app.serving.tenancy import Tenancy, rate_limited
from app.tenants.gate import InProcessLedger, TenantGate
from app.tenants.ledger import Ledger, Verdict, Limit
from app.tenants.policies import KeyPolicy, TokenBudget, key_hash

TWO_A_MINUTE = KeyPolicy(name="two", key_sha256=key_hash("k2"), requests_per_minute=2)
BUDGET = KeyPolicy(name="budget", key_sha256=key_hash("kb"), token_budget=TokenBudget(tokens=10, per="day"))
OPEN = KeyPolicy(name="open", key_sha256=key_hash("ko"))


def record(tenant: str, prompt: int = 4, completion: int = 8, status: str = "ok") -> RequestRecord:
    return RequestRecord(model="m", stream=False, status=status, error_code=None, duration_s=0.1, ttft_s=None,
                         itl_s=None, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=0,
                         tenant=tenant)


class Setup:
    def __init__(self) -> None:
        self.ledger = Ledger()
        self.tenancy = Tenancy(TenantGate(InProcessLedger(self.ledger)))
        self.observer = self.tenancy.observing(NullObserver())

    def work(self, caller: Caller, **usage):
        async def answer():
            self.observer.record(record(caller.tenant, **usage))  # what the lifecycle does as it ends
            return {"ok": True}
        return answer

    def report(self) -> dict:
        return self.ledger.usage_report()["keys"]


def test_a_key_past_its_rate_gets_a_429_with_openai_headers_and_nothing_runs() -> None:
    async def run():
        s, caller = Setup(), Caller(key_id="x", policy=TWO_A_MINUTE)
        for remaining in ("1", "0"):  # an admitted answer carries the key's rate-limit state too
            answer = await s.tenancy.admitted(caller, "chat", s.work(caller))
            assert isinstance(answer, WithHeaders) and answer.body == {"ok": True}
            assert answer.headers["x-ratelimit-limit-requests"] == "2"
            assert answer.headers["x-ratelimit-remaining-requests"] == remaining
            assert "retry-after" not in answer.headers
        ran = []
        with pytest.raises(APIError) as refused:
            await s.tenancy.admitted(caller, "chat", lambda: ran.append(1))
        err = refused.value
        assert not ran
        assert (err.status, err.type, err.code) == (429, "requests", "rate_limit_exceeded")
        assert err.headers["x-ratelimit-limit-requests"] == "2" and err.headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(err.headers["retry-after"]) <= 30 and int(err.headers["retry-after-ms"]) > 0
        assert s.report()["two"]["models"]["m"] == {"requests": 2, "prompt_tokens": 8, "cached_tokens": 0,
                                                    "completion_tokens": 16}
        assert s.report()["two"]["in_flight"] == 0
    asyncio.run(run())


def test_messages_refusals_carry_anthropic_headers() -> None:
    verdict = Verdict(False, "requests", 2.5, {"requests": Limit(2, 0, 30.0)}, "Rate limit reached.")
    err = rate_limited(verdict, "messages")
    assert err.status == 429 and err.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert err.headers["retry-after"] == "3" and not any(h.startswith("x-ratelimit") for h in err.headers)


def test_a_spent_budget_finishes_the_reply_under_way_and_refuses_the_next_with_insufficient_quota() -> None:
    async def run():
        s, caller = Setup(), Caller(key_id="b", policy=BUDGET)
        # The first request is admitted with 0 of 10 used, and uses 12: it is answered whole.
        assert await s.tenancy.admitted(caller, "chat", s.work(caller, prompt=4, completion=8)) == {"ok": True}
        with pytest.raises(APIError) as refused:
            await s.tenancy.admitted(caller, "chat", s.work(caller))
        assert (refused.value.status, refused.value.code) == (429, "insufficient_quota")
        other = Caller(key_id="o", policy=OPEN)  # another key is not stopped
        assert await s.tenancy.admitted(other, "chat", s.work(other)) == {"ok": True}
    asyncio.run(run())


def test_a_stream_is_refused_before_its_first_item_and_settled_when_closed_early() -> None:
    async def run():
        s, caller = Setup(), Caller(key_id="x", policy=TWO_A_MINUTE)
        closed = []

        async def events():
            try:
                yield []
                yield [{"delta": "a"}]
                yield [{"delta": "b"}]
            finally:  # as the lifecycle records a stream cut off by its client
                s.observer.record(record(caller.tenant, completion=1, status="cancelled"))
                closed.append(True)

        stream = s.tenancy.streamed(caller, "chat", events)
        headers, first = split_headers(await anext(stream))  # the "accepted" batch, led by the key's limits
        assert first == [] and headers["x-ratelimit-remaining-requests"] == "1"
        assert await anext(stream) == [{"delta": "a"}]
        await stream.aclose()  # the client went away after the first item
        assert closed == [True]
        report = s.report()["two"]
        assert report["in_flight"] == 0 and report["models"]["m"]["completion_tokens"] == 1
        await anext(s.tenancy.streamed(caller, "chat", events))  # the second of two a minute
        with pytest.raises(APIError) as refused:
            await anext(s.tenancy.streamed(caller, "chat", events))
        assert refused.value.status == 429
    asyncio.run(run())


def test_a_request_that_fails_before_its_record_returns_its_slot() -> None:
    async def run():
        s = Setup()
        one_at_a_time = KeyPolicy(name="one", key_sha256=key_hash("k1"), max_concurrent=1)
        caller = Caller(key_id="1", policy=one_at_a_time)

        async def planning_error():
            raise APIError("bad request", status=400)

        for _ in range(3):  # each 400 gives its slot back: the next is admitted, not refused as concurrent
            with pytest.raises(APIError) as failed:
                await s.tenancy.admitted(caller, "chat", planning_error)
            assert failed.value.status == 400
        assert s.report()["one"]["in_flight"] == 0
    asyncio.run(run())


def test_a_server_without_keys_counts_nothing() -> None:
    async def run():
        s = Setup()
        for _ in range(5):
            assert await s.tenancy.admitted(ANONYMOUS, "chat", s.work(ANONYMOUS)) == {"ok": True}
        assert s.report() == {}
    asyncio.run(run())
