"""The Processing interface with the trace context carried into each call: over a Ray hop, inside
a client span of its own (the hop's time is the gap between it and the span on the other side); in process,
as the current span's. The deployments wrap their client with these only when tracing is on, so an untraced
server calls its clients directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..api.schemas import DetokenizeRequest, TokenizeRequest
from ..observe import tracing
from ..generation.caller import Caller
from .processing import APIRequest, Processing


def hop_span(deployment: str, method: str, tier: str) -> Any:
    return tracing.current().start(f"{deployment}/{method}", kind="client", attributes={
        "llamaray.tier": tier, "rpc.system": "ray", "rpc.service": deployment, "rpc.method": method})


class HopProcessing:
    """Processing over a Ray hop (the Ingress's client of the ChatProcessor deployment), each generating call
    in a client span that the processing's span joins."""

    def __init__(self, inner: Processing, deployment: str) -> None:
        self.inner = inner
        self.deployment = deployment

    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        span = hop_span(self.deployment, "respond", "ingress")
        return await tracing.awaited_in(span, self.inner.respond(request, _under(caller, span)))

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        span = hop_span(self.deployment, "stream", "ingress")
        try:
            events = self.inner.stream(request, _under(caller, span))
        except BaseException as exc:  # refused before the call (a model no node can hold)
            tracing.end(span, exc)
            raise
        return tracing.stream_in(span, events)

    async def tokenize(self, request: TokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.inner.tokenize(request, caller)

    async def detokenize(self, request: DetokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.inner.detokenize(request, caller)

    async def stored_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        return await self.inner.stored_response(response_id, caller)

    async def delete_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        return await self.inner.delete_response(response_id, caller)
    async def count_tokens(self, request: Any, caller: Caller) -> dict[str, Any]:
        return await self.inner.count_tokens(request, caller)


def _under(caller: Caller, span: Any) -> Caller:
    return replace(caller, traceparent=tracing.traceparent_of(span))


def traced_processing(inner: Processing, deployment: str) -> Processing:
    """`inner` (a client of `deployment` over a Ray hop), with hop spans when tracing is on."""
    return HopProcessing(inner, deployment) if tracing.current().enabled else inner
