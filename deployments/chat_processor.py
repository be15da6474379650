"""ChatProcessor: prompt rendering and reply shaping between the Ingress and the models."""

from __future__ import annotations

import copy
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.chat import ChatService
from app.config import Limits, ModelSpec
from app.engine.params import GenerationRequest
from app.placement import CHAT_PROCESSOR_DEFAULTS
from app.schemas import ChatCompletionRequest

from .metrics import RayRequestObserver
from .relay import relay
from .replica import replica_info


@serve.deployment(name="ChatProcessor", **copy.deepcopy(CHAT_PROCESSOR_DEFAULTS))
class ChatProcessor:
    def __init__(self, specs: list[ModelSpec], models: dict[str, DeploymentHandle], limits: Limits) -> None:
        self.models = {mid: h.options(stream=True) for mid, h in models.items()}
        self.service = ChatService(specs, self._open_stream, limits=limits, observer=RayRequestObserver())

    def _open_stream(self, model_id: str, request: GenerationRequest):
        return relay(self.models[model_id].generate.remote(request))

    async def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        return await self.service.complete(request)

    async def stream(self, request: ChatCompletionRequest):
        async for batch in self.service.stream(request):
            yield batch

    def replica_info(self) -> dict[str, Any]:
        return replica_info()
