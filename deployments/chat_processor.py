"""ChatProcessor: prompt rendering and reply shaping between the Ingress and the models."""

from __future__ import annotations

import os
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.chat_service import ChatService
from app.config import ModelSpec

from .errors import to_api_error
from .metrics import RayRequestObserver


@serve.deployment(name="ChatProcessor", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=256)
class ChatProcessor:
    def __init__(self, specs: list[dict[str, Any]], models: dict[str, DeploymentHandle],
                 request_timeout_s: float = 300.0) -> None:
        self.models = {mid: h.options(stream=True) for mid, h in models.items()}
        self.service = ChatService([ModelSpec.from_dict(s) for s in specs], self._open_stream,
                                   request_timeout_s=request_timeout_s, observer=RayRequestObserver())

    async def _open_stream(self, model_id: str, request: dict[str, Any]):
        gen = self.models[model_id].generate.remote(request)
        try:
            async for batch in gen:
                yield batch
        except Exception as exc:  # noqa: BLE001
            raise to_api_error(exc) from None
        finally:
            gen.cancel()

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self.service.complete(payload)

    def replica_info(self) -> dict[str, Any]:
        """This replica's process and the resources Ray reserved for it (placement, fault tests)."""
        return {"pid": os.getpid(), "resources": ray.get_runtime_context().get_assigned_resources()}

    async def stream(self, payload: dict[str, Any]):
        async for batch in self.service.stream(payload):
            yield batch
