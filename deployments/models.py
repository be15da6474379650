"""The two ways the processing reaches the models (app.serving.models.Models): their engines in this very
replica (topology `single`), or their LlamaModel deployments over Ray handles (topology `graph`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.engine.events import Event
from app.engine.params import EmbeddingJob, EmbeddingResult, GenerationRequest, ImageInput, RerankJob, RerankResult

from .engine_host import EngineHost
from .error_mapping import call_mapped, to_api_error
from .handles import StreamHop, unary
from .relay import relay


class LocalModels:
    """Engines hosted in this process: no Ray hop at all. No Serve queue stands in front of them, so each
    host bounds its own waiting requests (503 past it)."""

    def __init__(self, hosts: dict[str, EngineHost]) -> None:
        self.hosts = hosts

    async def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        try:
            async for batch in self.hosts[model_id].generate(request, bounded=True):
                yield batch
        except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError, as over a handle
            raise to_api_error(exc) from None

    async def embed(self, model_id: str, job: EmbeddingJob | RerankJob) -> EmbeddingResult | RerankResult:
        try:
            return await self.hosts[model_id].embed(job, bounded=True)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError, as over a handle
            raise to_api_error(exc) from None

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]:
        return await self.hosts[model_id].tokenize(text, add_special)

    async def count_prompt(self, model_id: str, prompt: str, images: list[ImageInput]) -> int:
        return await self.hosts[model_id].count_prompt(prompt, images)

    async def detokenize(self, model_id: str, tokens: list[int]) -> str:
        return await self.hosts[model_id].detokenize(tokens)

    async def stats(self, model_id: str) -> dict[str, Any]:
        return self.hosts[model_id].stats()

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()


class RemoteModels:
    """Models in LlamaModel deployments of their own, over their handles (one Ray hop per streamed item)."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        # A request with images, or a long prompt, goes by reference (deployments/handles.py): one image's
        # pixels take up to limits.max_image_side² x 3 bytes (12 MiB at 2048), past gRPC's 4 MiB.
        self.handles = {mid: unary(h) for mid, h in handles.items()}
        self.streams = {mid: StreamHop(h) for mid, h in handles.items()}

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        return relay(lambda: self.streams[model_id].to(request).generate.remote(request))

    async def embed(self, model_id: str, job: EmbeddingJob | RerankJob) -> EmbeddingResult | RerankResult:
        return await call_mapped(lambda: self.handles[model_id].embed.remote(job))

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]:
        return await call_mapped(lambda: self.handles[model_id].tokenize.remote(text, add_special))

    async def count_prompt(self, model_id: str, prompt: str, images: list[ImageInput]) -> int:
        return await call_mapped(lambda: self.handles[model_id].count_prompt.remote(prompt, images))

    async def detokenize(self, model_id: str, tokens: list[int]) -> str:
        return await call_mapped(lambda: self.handles[model_id].detokenize.remote(tokens))

    async def stats(self, model_id: str) -> dict[str, Any]:
        return await self.handles[model_id].stats.remote()

    def close(self) -> None:
        pass  # the replicas are Serve's
