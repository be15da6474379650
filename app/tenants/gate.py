"""Each Ingress replica's door to the ledger: a limited key's request is admitted by the cluster's ledger (one
call per request, none per token), an unlimited key's costs no call at all (its usage is sent in batches).

When the shared ledger cannot be reached, the replica counts on its own with each limit divided by the number
of Ingress replicas: limits stay (per replica), nobody is refused for the outage, and `degraded` says so
(a warning in the log once, a metric)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .ledger import Ledger, Usage, Verdict
from .policies import KeyPolicy, TokenBudget

log = logging.getLogger("llamaray.tenants")

ADMITTED = Verdict(True)

Owed = tuple[KeyPolicy, str, "Usage | None", bool]
"""What a replica still has to tell the shared ledger: a key's usage on a model, and whether a request it
admitted is over (its settle was lost)."""
# A ledger slower than this is treated as unreachable for that request: admission must not hang on it.
LEDGER_TIMEOUT_S = 1.0
# Usage of unlimited keys is sent at most this often (one call for all of them).
FLUSH_EVERY_S = 1.0


class SharedLedger(Protocol):
    """The ledger over a Ray handle (deployments/tenant_ledger.py) or in this process (InProcessLedger)."""

    async def admit(self, policy: KeyPolicy) -> Verdict: ...

    async def settle(self, policy: KeyPolicy, model: str, usage: Usage) -> None: ...

    async def release(self, policy: KeyPolicy) -> None: ...

    async def record(self, batch: list[Owed]) -> None: ...

    async def usage_report(self) -> dict[str, Any]: ...


class InProcessLedger:
    """A Ledger called in this process (one replica serves everything, or tests)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.ledger = ledger or Ledger()

    async def admit(self, policy: KeyPolicy) -> Verdict:
        return self.ledger.admit(policy)

    async def settle(self, policy: KeyPolicy, model: str, usage: Usage) -> None:
        self.ledger.settle(policy, model, usage)

    async def release(self, policy: KeyPolicy) -> None:
        self.ledger.release(policy)

    async def record(self, batch: list[Owed]) -> None:
        self.ledger.settle_owed(batch)

    async def usage_report(self) -> dict[str, Any]:
        return self.ledger.usage_report()


@dataclass
class Ticket:
    """An admitted request: settled once, on the ledger that admitted it."""

    policy: KeyPolicy
    verdict: Verdict
    where: str  # "shared", "local" (degraded) or "none" (an unlimited key: nothing to return)
    settled: bool = False


def replica_share(policy: KeyPolicy, replicas: int) -> KeyPolicy:
    """The policy one of `replicas` Ingress replicas enforces alone: each limit divided, never below one."""
    if replicas <= 1:
        return policy

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, math.ceil(value / replicas))

    budget = policy.token_budget
    return policy.model_copy(update={
        "requests_per_minute": part(policy.requests_per_minute),
        "tokens_per_minute": part(policy.tokens_per_minute),
        "max_concurrent": part(policy.max_concurrent),
        "token_budget": None if budget is None else TokenBudget(tokens=part(budget.tokens), per=budget.per),
    })


class TenantGate:
    """`shared`: the cluster's ledger; `replicas`: how many Ingress replicas share it (the divisor when it
    cannot be reached); `on_degraded(bool)`: told when that state changes."""

    def __init__(self, shared: SharedLedger, replicas: int = 1, *, timeout_s: float = LEDGER_TIMEOUT_S,
                 on_degraded: Callable[[bool], None] | None = None) -> None:
        self.shared = shared
        self.replicas = max(1, replicas)
        self.timeout_s = timeout_s
        self.on_degraded = on_degraded or (lambda degraded: None)
        self.local = Ledger()
        self.degraded = False
        self._unsent: list[Owed] = []
        # Usage recorded for a key and not yet settled, by model: settled with the key's next finished ticket.
        self._pending: dict[str, dict[str, Usage]] = {}
        self._policies: dict[str, KeyPolicy] = {}  # each key's policy as last admitted (bounded by the keys file)
        self._flusher: asyncio.Task | None = None

    def _set_degraded(self, degraded: bool, why: BaseException | None = None) -> None:
        if degraded == self.degraded:
            return
        self.degraded = degraded
        if degraded:
            log.warning("tenant ledger unreachable (%r): enforcing each key's limits per Ingress replica "
                        "(divided by %d) until it is back", why, self.replicas)
        else:
            log.warning("tenant ledger reachable again: limits are the cluster's")
        self.on_degraded(degraded)

    async def admit(self, policy: KeyPolicy) -> Ticket:
        self._policies[policy.name] = policy
        if not policy.limited:
            return Ticket(policy, ADMITTED, "none")
        try:
            verdict = await asyncio.wait_for(self.shared.admit(policy), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - an unreachable ledger must not refuse everyone
            self._set_degraded(True, exc)
            return Ticket(policy, self.local.admit(replica_share(policy, self.replicas)), "local")
        self._set_degraded(False)
        return Ticket(policy, verdict, "shared")

    async def settle(self, ticket: Ticket, model: str, usage: Usage | None) -> None:
        """The request is over: `usage` counted (None: it never reached the model)."""
        if ticket.settled or not ticket.verdict.admitted:
            return
        ticket.settled = True
        policy = ticket.policy
        if ticket.where == "none":
            if usage is not None:
                self._owe((policy, model, usage, False))
            return
        if ticket.where == "local":
            share = replica_share(policy, self.replicas)
            if usage is None:
                self.local.release(share)
            else:
                self.local.settle(share, model, usage)
                # Still owed to the shared record: sent with the next batch, once it is back.
                self._owe((policy, model, usage, False))
            return
        try:
            if usage is None:
                await asyncio.wait_for(self.shared.release(policy), self.timeout_s)
            else:
                await asyncio.wait_for(self.shared.settle(policy, model, usage), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the usage is kept for a later batch
            self._set_degraded(True, exc)
            self._owe((policy, model, usage, True))

    async def usage_report(self) -> dict[str, Any]:
        """The shared ledger's report, once what this replica still owes it is sent (raises if unreachable)."""
        await self.flush()
        return await asyncio.wait_for(self.shared.usage_report(), self.timeout_s)

    def used(self, tenant: str, model: str, usage: Usage) -> None:
        """What one of a key's requests used (its record, however it ended: answered, failed, cut off by the
        client). A limited key's usage is settled with its next finished ticket (one call returns the
        request and its tokens); an unlimited key's is sent in the next batch."""
        policy = self._policies.get(tenant)
        if policy is None:
            return  # a request no ticket was asked for (a count, a lookup): nothing to account
        if not policy.limited:
            self._owe((policy, model, usage, False))
            return
        self._pending.setdefault(tenant, {}).setdefault(model, Usage()).add(usage)

    async def finish(self, ticket: Ticket) -> None:
        """The request is over: settled with the usage its key's requests recorded meanwhile (usually its own;
        under concurrency another's of the same key, which sums the same)."""
        pending = list(self._pending.pop(ticket.policy.name, {}).items())
        model, usage = pending[0] if pending else ("", None)
        await self.settle(ticket, model, usage)
        for model, usage in pending[1:]:
            self._owe((ticket.policy, model, usage, False))

    def _owe(self, entry: Owed) -> None:
        self._unsent.append(entry)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(FLUSH_EVERY_S)
        await self.flush()

    async def flush(self) -> bool:
        """Send the usage not yet recorded by the shared ledger; False (kept for later) if it cannot be."""
        batch, self._unsent = self._unsent, []
        if not batch:
            return True
        try:
            await asyncio.wait_for(self.shared.record(batch), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - kept, tried again with the next batch
            self._unsent = batch + self._unsent
            self._set_degraded(True, exc)
            self._schedule_flush()
            return False
        return True
