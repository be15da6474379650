"""The two ways the processing reaches the models (app.serving.models.Models): their engines in this very
replica (topology `single`), or their LlamaModel deployments over Ray handles (topology `graph`). Both only
forward `generate` and `run`: a new kind of job (app/engine/jobs.py) changes neither."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.engine.events import Event
from app.engine.params import GenerationRequest, Job
from app.serving.models import R

from .channels import stream_call
from .error_mapping import call_mapped, to_api_error
from .handles import StreamHop, unary


class LocalModels:
    """Engines hosted in this process (EngineHosts, or PooledHosts of a pool): no Ray hop at all. No Serve
    queue stands in front of them, so each host bounds its own waiting requests (503 past it)."""

    def __init__(self, hosts: dict[str, Any]) -> None:
        self.hosts = hosts

    async def generate(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        try:
            async for batch in self.hosts[model_id].generate(request, bounded=True):
                yield batch
        except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError, as over a handle
            raise to_api_error(exc) from None

    async def run(self, model_id: str, job: Job[R]) -> R:
        try:
            return await self.hosts[model_id].run(job, bounded=True)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError, as over a handle
            raise to_api_error(exc) from None

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()


class RemoteModels:
    """Models in LlamaModel (or LlamaPool) deployments of their own, over their handles: one Serve call per
    stream, its items through the model replica's stream channel to this replica (or, with `channels` off,
    one Ray hop per streamed item)."""

    def __init__(self, handles: dict[str, DeploymentHandle], channels: bool = True) -> None:
        # A request with images, or a long prompt, goes by reference (deployments/handles.py): one image's
        # pixels take up to limits.max_image_side² x 3 bytes (12 MiB at 2048), past gRPC's 4 MiB. A job
        # answers once, so it always does (an embedding reply may be large too).
        self.handles = {mid: unary(h) for mid, h in handles.items()}
        self.streams = {mid: StreamHop(h) for mid, h in handles.items()}
        self.channels = channels  # the streamed items through stream channels (deployments/channels.py)

    def generate(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        return stream_call(self.channels,
                           lambda *route: self.streams[model_id].to(request).generate.remote(request, *route))

    async def run(self, model_id: str, job: Job[R]) -> R:
        return await call_mapped(lambda: self.handles[model_id].run.remote(job))

    def close(self) -> None:
        pass  # the replicas are Serve's
