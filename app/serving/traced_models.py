"""The Models interface with the trace context carried into each generation: over a Ray hop, inside a client
span of its own; in process, as the current span's. Wrapped only when tracing is on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from ..engine.events import Event
from ..engine.params import GenerationRequest, Job
from ..observe import tracing
from .models import Models, R
from .traced import hop_span


class TracedModels:
    """Models whose generations carry the trace context: each in a client span of its own when `deployments`
    (model id -> its deployment) says they are across a Ray hop, else the current span's (same process)."""

    def __init__(self, inner: Models, deployments: dict[str, str] | None = None) -> None:
        self.inner = inner
        self.deployments = deployments

    def generate(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        if self.deployments is None:
            return self.inner.generate(model_id, replace(request, traceparent=tracing.traceparent_of()))
        span = hop_span(self.deployments[model_id], "generate", "processor")
        return tracing.stream_in(span, self.inner.generate(
            model_id, replace(request, traceparent=tracing.traceparent_of(span))))

    async def run(self, model_id: str, job: Job[R]) -> R:
        return await self.inner.run(model_id, job)

    def close(self) -> None:
        self.inner.close()


def traced_models(inner: Models, deployments: dict[str, str] | None = None) -> Models:
    """`inner`, carrying trace context into its generations when tracing is on (see TracedModels)."""
    return TracedModels(inner, deployments) if tracing.current().enabled else inner
