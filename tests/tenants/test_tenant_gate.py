"""The gate: one ledger call per limited request, none for unlimited keys, per-replica limits while the
shared ledger is unreachable, and usage kept until it can be recorded."""

from __future__ import annotations

import asyncio

from app.tenants.gate import InProcessLedger, TenantGate, replica_share
from app.tenants.ledger import Ledger, Usage
from app.tenants.policies import KeyPolicy, TokenBudget, key_hash

LIMITED = KeyPolicy(name="limited", key_sha256=key_hash("a"), requests_per_minute=4, max_concurrent=8,
                    token_budget=TokenBudget(tokens=1000, per="day"))
OPEN = KeyPolicy(name="open", key_sha256=key_hash("b"))


class Flaky(InProcessLedger):
    """A shared ledger that can be cut off, counting the calls it gets."""

    def __init__(self) -> None:
        super().__init__(Ledger())
        self.down = False
        self.calls = 0

    def _call(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError("ledger actor unreachable")

    async def admit(self, policy):
        self._call()
        return await super().admit(policy)

    async def settle(self, policy, model, usage):
        self._call()
        await super().settle(policy, model, usage)

    async def release(self, policy):
        self._call()
        await super().release(policy)

    async def record(self, batch):
        self._call()
        await super().record(batch)


def test_replicas_share_the_cluster_limit_through_one_ledger() -> None:
    async def run():
        shared = Flaky()
        gates = [TenantGate(shared, replicas=2), TenantGate(shared, replicas=2)]
        tickets = [await gates[i % 2].admit(LIMITED) for i in range(6)]
        assert [t.verdict.admitted for t in tickets] == [True] * 4 + [False] * 2
        assert shared.calls == 6  # one per request
        for t in tickets:
            await gates[0].settle(t, "m", Usage(1, 10, 0, 5))
        report = await shared.usage_report()
        assert report["keys"]["limited"]["models"]["m"]["requests"] == 4  # refused ones are not counted
        assert report["keys"]["limited"]["in_flight"] == 0
    asyncio.run(run())


def test_unlimited_keys_cost_no_call_per_request_and_are_recorded_in_batches() -> None:
    async def run():
        shared = Flaky()
        gate = TenantGate(shared)
        for _ in range(5):
            ticket = await gate.admit(OPEN)
            await gate.settle(ticket, "m", Usage(1, 3, 1, 2))
        assert shared.calls == 0
        assert await gate.flush() and shared.calls == 1
        assert (await shared.usage_report())["keys"]["open"]["models"]["m"] == {
            "requests": 5, "prompt_tokens": 15, "cached_tokens": 5, "completion_tokens": 10}
    asyncio.run(run())


def test_an_unreachable_ledger_degrades_to_per_replica_limits_never_to_none_or_to_refusing_all() -> None:
    async def run():
        shared, changes = Flaky(), []
        gate = TenantGate(shared, replicas=2, on_degraded=changes.append)
        shared.down = True
        tickets = [await gate.admit(LIMITED) for _ in range(4)]
        assert [t.verdict.admitted for t in tickets] == [True, True, False, False]  # 4 per minute / 2 replicas
        assert gate.degraded and changes == [True]
        await gate.settle(tickets[0], "m", Usage(1, 100, 0, 50))
        assert not await gate.flush()  # kept for later
        shared.down = False
        assert (await gate.admit(LIMITED)).verdict.admitted and changes == [True, False]
        assert await gate.flush()
        report = await shared.usage_report()
        assert report["keys"]["limited"]["models"]["m"]["prompt_tokens"] == 100
        assert report["keys"]["limited"]["budget"]["used"] == 150  # what was spent while cut off counts
    asyncio.run(run())


def test_a_ticket_settles_once() -> None:
    async def run():
        shared = Flaky()
        gate = TenantGate(shared)
        ticket = await gate.admit(LIMITED)
        await gate.settle(ticket, "m", Usage(1, 1, 0, 1))
        await gate.settle(ticket, "m", Usage(1, 1, 0, 1))
        assert (await shared.usage_report())["keys"]["limited"]["models"]["m"]["requests"] == 1
    asyncio.run(run())


def test_a_replicas_share_divides_every_limit_and_keeps_at_least_one() -> None:
    share = replica_share(LIMITED.model_copy(update={"tokens_per_minute": 3}), 4)
    assert share.requests_per_minute == 1 and share.tokens_per_minute == 1 and share.max_concurrent == 2
    assert share.token_budget.tokens == 250 and replica_share(LIMITED, 1) is LIMITED


def test_a_lost_settle_is_sent_later_so_the_key_is_not_left_in_flight() -> None:
    async def run():
        shared = Flaky()
        gate = TenantGate(shared)
        one = LIMITED.model_copy(update={"max_concurrent": 1, "requests_per_minute": None})
        ticket = await gate.admit(one)
        shared.down = True
        await gate.settle(ticket, "m", Usage(1, 1, 0, 1))
        shared.down = False
        assert not (await shared.admit(one)).admitted  # the shared ledger still counts it in flight
        assert await gate.flush()
        assert (await gate.admit(one)).verdict.admitted
    asyncio.run(run())
