"""The Processing interface with the trace context carried into each call: over a Ray hop, inside
a client span of its own (the hop's time is the gap between it and the span on the other side); in process,
as the current span's. The deployments wrap their client with these only when tracing is on, so an untraced
server calls its clients directly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from ..observe import tracing
from ..generation.caller import Caller
from .processing import Processing

HopTraced = Callable[[Any], bool]
"""Whether a request's hops get spans of their own (a generation's do; a lookup's, such as a token count or a
stored response, do not): the route table says (app/http/routes.py)."""


def hop_span(deployment: str, method: str, tier: str) -> Any:
    return tracing.current().start(f"{deployment}/{method}", kind="client", attributes={
        "llamaray.tier": tier, "rpc.system": "ray", "rpc.service": deployment, "rpc.method": method})


class HopProcessing:
    """Processing over a Ray hop (the Ingress's client of the ChatProcessor deployment), each call that
    `hop_traced` names in a client span that the processing's span joins."""

    def __init__(self, inner: Processing, deployment: str, hop_traced: HopTraced) -> None:
        self.inner = inner
        self.deployment = deployment
        self.hop_traced = hop_traced

    async def respond(self, request: Any, caller: Caller) -> dict[str, Any]:
        if not self.hop_traced(request):
            return await self.inner.respond(request, caller)
        span = hop_span(self.deployment, "respond", "ingress")
        return await tracing.awaited_in(span, self.inner.respond(request, _under(caller, span)))

    def stream(self, request: Any, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        if not self.hop_traced(request):
            return self.inner.stream(request, caller)
        span = hop_span(self.deployment, "stream", "ingress")
        try:
            events = self.inner.stream(request, _under(caller, span))
        except BaseException as exc:  # refused before the call (a model no node can hold)
            tracing.end(span, exc)
            raise
        return tracing.stream_in(span, events)


def _under(caller: Caller, span: Any) -> Caller:
    return replace(caller, traceparent=tracing.traceparent_of(span))


def traced_processing(inner: Processing, deployment: str, hop_traced: HopTraced) -> Processing:
    """`inner` (a client of `deployment` over a Ray hop), with hop spans when tracing is on."""
    return HopProcessing(inner, deployment, hop_traced) if tracing.current().enabled else inner
