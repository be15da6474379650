"""ChatProcessor: prompt rendering and reply shaping between the Ingress and the models."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.chat_service import ChatService
from app.config import Limits, ModelSpec

from .errors import to_api_error
from .metrics import RayRequestObserver
from .replica import replica_info


@serve.deployment(name="ChatProcessor", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=256)
class ChatProcessor:
    def __init__(self, specs: list[dict[str, Any]], models: dict[str, DeploymentHandle],
                 limits: dict[str, Any] | None = None) -> None:
        self.models = {mid: h.options(stream=True) for mid, h in models.items()}
        self.service = ChatService([ModelSpec.from_dict(s) for s in specs], self._open_stream,
                                   limits=Limits(**(limits or {})), observer=RayRequestObserver())

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
        return replica_info()

    async def stream(self, payload: dict[str, Any]):
        async for batch in self.service.stream(payload):
            yield batch
