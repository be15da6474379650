"""LlamaModel: one replica owns one llama.cpp context and batches many requests over it: generations for a
chat model, embeddings for an embedding model, scores for a reranker (`kind` in its entry; EngineHost starts the engine it names)."""

from __future__ import annotations

import threading
from typing import Any

from ray import serve

from app.config.app_args import TracingConfig
from app.config.spec import ModelSpec
from app.engine import GenerationRequest
from app.engine.params import Job
from app.serving.models import ModelState

from app.transport.stream_channels import ChannelRoute

from . import model_status
from .channels import channel_info, served
from .engine_host import EngineHost
from .error_mapping import answered
from .replica import replica_info, start_replica


@serve.deployment(name="LlamaModel", ray_actor_options={"num_cpus": 1}, health_check_period_s=10)
class LlamaModel:
    def __init__(self, spec: ModelSpec, tracing_config: TracingConfig | None = None) -> None:
        start_replica(tracing_config)
        self._health_checks = 0  # Serve's checks so far (fault tests wait on them)
        context = serve.get_replica_context()
        self._where = (context.app_name, context.deployment, context.replica_id.unique_id)
        self._published: ModelState | None = None
        self._publish_lock = threading.Lock()
        # A download's progress is published on each health check; its end and the engine's start at once.
        self.host = EngineHost(spec, on_change=self._publish)
        self._publish()

    def _publish(self) -> None:
        host = getattr(self, "host", None)
        if host is None:
            return  # the constructor publishes once the host exists
        with self._publish_lock:
            state = host.state()
            if state != self._published:
                model_status.publish(*self._where, state)
                self._published = state

    async def generate(self, request: GenerationRequest, route: ChannelRoute | None = None):
        async for item in served(route, self.host.generate(request)):
            yield item

    async def run(self, job: Job[Any]) -> Any:
        """Any other job (app/engine/jobs.py), answered by EngineHost by its type."""
        return await answered(self.host.run(job))

    def replica_info(self) -> dict[str, Any]:
        return {**replica_info(), **self.host.info(), "health_checks": self._health_checks, "channels": channel_info()}

    def check_health(self) -> None:
        self._health_checks += 1
        self._publish()
        self.host.check_health()

    def __del__(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.close()
        if getattr(self, "_where", None):
            model_status.withdraw(*self._where)
