"""LlamaModel: one replica owns one llama.cpp context and batches many requests over it."""

from __future__ import annotations

import os
from typing import Any

import ray
from ray import serve

from app.config import ModelSpec
from app.engine import GenerationRequest, LlamaEngine
from app.engine.stream import generate_stream


@serve.deployment(name="LlamaModel", ray_actor_options={"num_cpus": 1}, health_check_period_s=10)
class LlamaModel:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = ModelSpec.from_dict(spec)
        self.engine = LlamaEngine(self.spec)

    async def generate(self, request: dict[str, Any]):
        req = GenerationRequest.from_dict(request)
        async for batch in generate_stream(self.engine, req, self.spec.stream_interval_ms / 1000):
            yield batch

    async def stats(self) -> dict[str, Any]:
        return {"model": self.spec.id, "pid": os.getpid(), **self.engine.stats()}

    def resources(self) -> dict[str, float]:
        """Resources Ray reserved for this replica (GPU placement checks)."""
        return ray.get_runtime_context().get_assigned_resources()

    def check_health(self) -> None:
        if not self.engine.healthy():
            raise RuntimeError(f"llama.cpp engine for {self.spec.id} is unhealthy: {self.engine.broken}")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
