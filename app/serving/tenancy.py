"""Each key's limits on the processing's path: a metered request (a generation, an embedding, a rerank) is
admitted by the tenant gate before any work is done for it, or refused with a 429 in its protocol's shape;
when it is over, its ticket is settled with the usage its record says it used, however it ended (answered,
failed, cut off by the client mid-stream).

Here and not in the Ingress because this is where a request's cost becomes known (its record), where it is
planned and generated; the Ingress stays keys, HTTP and SSE framing. The gate's ledger is shared by every
replica of the processing (deployments/tenant_ledger.py), so limits hold for the cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..api.errors import APIError
from ..generation.caller import Caller
from ..observe.request_records import RequestObserver, RequestRecord
from ..tenants.gate import TenantGate, Ticket
from ..tenants.headers import anthropic_headers, openai_headers
from ..tenants.ledger import Usage, Verdict
from .reply_headers import StreamHeaders, WithHeaders

# OpenAI's 429 bodies: a rate limit is `rate_limit_exceeded` of type `requests` or `tokens`; a spent budget is
# `insufficient_quota` (the SDK does not retry it: it will not pass in seconds).
_REFUSALS = {"requests": ("requests", "rate_limit_exceeded"), "tokens": ("tokens", "rate_limit_exceeded"),
             "concurrency": ("requests", "rate_limit_exceeded"), "budget": ("insufficient_quota", "insufficient_quota")}


@dataclass(frozen=True)
class UsageRequest:
    """GET /v1/usage: the usage the caller may read (every key's for an admin key or a server without keys,
    its own otherwise)."""


class TenantEvents(Protocol):
    """What the gate tells metrics: a refusal (key, reason) and the shared ledger lost or back."""

    def refused(self, tenant: str, reason: str) -> None: ...

    def degraded(self, degraded: bool) -> None: ...


class NoEvents:
    def refused(self, tenant: str, reason: str) -> None:
        pass

    def degraded(self, degraded: bool) -> None:
        pass


def _limit_headers(ticket: Ticket | None, protocol: str) -> dict[str, str]:
    """An admitted request's rate-limit headers in its protocol's names (none for a key without rate limits)."""
    if ticket is None or not ticket.verdict.limits:
        return {}
    return anthropic_headers(ticket.verdict) if protocol == "messages" else openai_headers(ticket.verdict)


def rate_limited(verdict: Verdict, protocol: str) -> APIError:
    """The 429 of a refused request, with the headers its protocol's SDK reads before retrying (Anthropic's
    `anthropic-ratelimit-*` on Messages; OpenAI's `x-ratelimit-*` elsewhere; `retry-after` on both)."""
    kind, code = _REFUSALS.get(verdict.reason or "", ("requests", "rate_limit_exceeded"))
    headers = anthropic_headers(verdict) if protocol == "messages" else openai_headers(verdict)
    return APIError(verdict.message or "Rate limit reached for this key.", status=429, type=kind, code=code,
                    headers=headers)


class Tenancy:
    """The gate as the Processor uses it: `admitted(...)` around a whole answer, `streamed(...)` around a
    stream's events, `observing(observer)` to hear what each request used."""

    def __init__(self, gate: TenantGate, events: TenantEvents | None = None) -> None:
        self.gate = gate
        self.events = events or NoEvents()

    async def _admit(self, caller: Caller, protocol: str) -> Ticket | None:
        if caller.policy is None:
            return None  # a server without keys: one tenant, nothing to count
        ticket = await self.gate.admit(caller.policy)
        if not ticket.verdict.admitted:
            self.events.refused(caller.tenant, ticket.verdict.reason or "")
            raise rate_limited(ticket.verdict, protocol)
        return ticket

    async def admitted(self, caller: Caller, protocol: str, work: Callable[[], Awaitable[Any]]) -> Any:
        """`work()`'s answer once admitted, with the key's rate-limit headers when it has limits (WithHeaders)."""
        ticket = await self._admit(caller, protocol)
        try:
            body = await work()
        finally:
            if ticket is not None:
                await self.gate.finish(ticket)
        headers = _limit_headers(ticket, protocol)
        return WithHeaders(body, headers) if headers else body

    async def streamed(self, caller: Caller, protocol: str,
                       events: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        """The stream's events once admitted (a refusal is raised before its first item, so the HTTP layer
        answers it with its status and headers), its first batch led by the key's rate-limit headers when it has
        limits (StreamHeaders); its ticket settled when it ends or is closed."""
        ticket = await self._admit(caller, protocol)
        headers = _limit_headers(ticket, protocol)
        source = events()
        try:
            async for item in source:
                if headers:
                    item, headers = [StreamHeaders(headers), *item], None
                yield item
        finally:
            # Closed first: its record (what it used so far) is made as it closes, before the settle.
            await source.aclose()
            if ticket is not None:
                await self.gate.finish(ticket)

    async def usage(self, request: UsageRequest, caller: Caller) -> dict[str, Any]:
        """What the ledger has counted (the shared one; this replica's own while it is unreachable)."""
        try:
            report = await self.gate.usage_report()
        except Exception:  # noqa: BLE001 - the shared ledger is unreachable: this replica's counts, said so
            report, degraded = self.gate.local.usage_report(), True
        else:
            degraded = False
        keys = report.get("keys", {})
        if caller.policy is not None and not caller.policy.admin:
            keys = {name: entry for name, entry in keys.items() if name == caller.policy.name}
        return {"object": "usage", "keys": keys, "degraded": degraded}

    def observing(self, inner: RequestObserver) -> RequestObserver:
        return _UsageObserver(inner, self.gate)


class _UsageObserver:
    """Every request's record to `inner`, and its tokens to the gate under its key."""

    def __init__(self, inner: RequestObserver, gate: TenantGate) -> None:
        self.inner = inner
        self.gate = gate

    def record(self, rec: RequestRecord) -> None:
        self.inner.record(rec)
        if rec.tenant:
            model = f"{rec.model}:{rec.adapter}" if rec.adapter and "," not in rec.adapter else rec.model
            batch = (1, rec.prompt_tokens + rec.completion_tokens) if rec.batch else (0, 0)
            self.gate.used(rec.tenant, model, Usage(1, rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens,
                                                     *batch))
