"""The Models interface with the trace context carried into each generation: over a Ray hop, inside a client
span of its own; in process, as the current span's. Wrapped only when tracing is on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..engine.events import Event
from ..engine.params import EmbeddingJob, EmbeddingResult, GenerationRequest, ImageInput, RerankJob, RerankResult
from ..observe import tracing
from .models import Models
from .traced import hop_span


class TracedModels:
    """Models whose generations carry the trace context: each in a client span of its own when `deployments`
    (model id -> its deployment) says they are across a Ray hop, else the current span's (same process)."""

    def __init__(self, inner: Models, deployments: dict[str, str] | None = None) -> None:
        self.inner = inner
        self.deployments = deployments

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        if self.deployments is None:
            return self.inner.open_stream(model_id, replace(request, traceparent=tracing.traceparent_of()))
        span = hop_span(self.deployments[model_id], "generate", "processor")
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



def traced_models(inner: Models, deployments: dict[str, str] | None = None) -> Models:
    """`inner`, carrying trace context into its generations when tracing is on (see TracedModels)."""
    return TracedModels(inner, deployments) if tracing.current().enabled else inner
