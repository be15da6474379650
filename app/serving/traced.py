"""The Processing and Models interfaces with the trace context carried into each call: over a Ray hop, inside
a client span of its own (the hop's time is the gap between it and the span on the other side); in process,
as the current span's. The deployments wrap their clients with these only when tracing is on, so an untraced
server calls its clients directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..api.schemas import DetokenizeRequest, TokenizeRequest
from ..engine.events import Event
from ..engine.params import EmbeddingJob, EmbeddingResult, GenerationRequest, ImageInput, RerankJob, RerankResult
from ..observe import tracing
from ..generation.caller import Caller
from .models import Models
from .processing import APIRequest, Processing


def _hop(deployment: str, method: str, tier: str) -> Any:
    return tracing.current().start(f"{deployment}/{method}", kind="client", attributes={
        "llamaray.tier": tier, "rpc.system": "ray", "rpc.service": deployment, "rpc.method": method})


class HopProcessing:
    """Processing over a Ray hop (the Ingress's client of the ChatProcessor deployment), each generating call
    in a client span that the processing's span joins."""

    def __init__(self, inner: Processing, deployment: str) -> None:
        self.inner = inner
        self.deployment = deployment

    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        span = _hop(self.deployment, "respond", "ingress")
        return await tracing.awaited_in(span, self.inner.respond(request, _under(caller, span)))

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        span = _hop(self.deployment, "stream", "ingress")
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


class TracedModels:
    """Models whose generations carry the trace context: each in a client span of its own when `deployments`
    (model id -> its deployment) says they are across a Ray hop, else the current span's (same process)."""

    def __init__(self, inner: Models, deployments: dict[str, str] | None = None) -> None:
        self.inner = inner
        self.deployments = deployments

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        if self.deployments is None:
            return self.inner.open_stream(model_id, replace(request, traceparent=tracing.traceparent_of()))
        span = _hop(self.deployments[model_id], "generate", "processor")
        return tracing.stream_in(span, self.inner.open_stream(
            model_id, replace(request, traceparent=tracing.traceparent_of(span))))

    async def embed(self, model_id: str, job: EmbeddingJob | RerankJob) -> EmbeddingResult | RerankResult:
        return await self.inner.embed(model_id, job)

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]:
        return await self.inner.tokenize(model_id, text, add_special)

    async def count_prompt(self, model_id: str, prompt: str, images: list[ImageInput]) -> int:
        return await self.inner.count_prompt(model_id, prompt, images)

    async def detokenize(self, model_id: str, tokens: list[int]) -> str:
        return await self.inner.detokenize(model_id, tokens)

    async def stats(self, model_id: str) -> dict[str, Any]:
        return await self.inner.stats(model_id)

    def close(self) -> None:
        self.inner.close()


def traced_processing(inner: Processing, deployment: str) -> Processing:
    """`inner` (a client of `deployment` over a Ray hop), with hop spans when tracing is on."""
    return HopProcessing(inner, deployment) if tracing.current().enabled else inner


def traced_models(inner: Models, deployments: dict[str, str] | None = None) -> Models:
    """`inner`, carrying trace context into its generations when tracing is on (see TracedModels)."""
    return TracedModels(inner, deployments) if tracing.current().enabled else inner
