"""ChatProcessor: prompt rendering and reply shaping between the Ingress and the models (chat, legacy
text completions, and the tokenizer routes, whose ids come from the model replicas)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any, Protocol

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.chat import ChatService
from app.completions import CompletionService
from app.config import Limits, ModelSpec
from app.engine.params import GenerationRequest
from app.placement import CHAT_PROCESSOR_DEFAULTS
from app.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from app.tokens import TokenService

from .errors import to_api_error
from .metrics import RayRequestObserver
from .model_host import ModelHost
from .relay import relay
from .replica import replica_info


class Models(Protocol):
    """How the processing reaches the models: token ids (app.tokens.ModelTokens) and generation streams."""

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[Any]: ...

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]: ...

    async def detokenize(self, model_id: str, tokens: list[int]) -> str: ...


class Processing:
    """The ChatProcessor's work as a plain object: a deployment of its own, or inside the Ingress."""

    def __init__(self, specs: list[ModelSpec], models: Models, limits: Limits) -> None:
        observer = RayRequestObserver()
        self.service = ChatService(specs, models.open_stream, limits=limits, observer=observer)
        self.completions = CompletionService(specs, models.open_stream, limits=limits, observer=observer)
        self.tokens = TokenService(specs, models, limits=limits)

    async def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        return await self.service.complete(request)

    async def stream(self, request: ChatCompletionRequest):
        async for batch in self.service.stream(request):
            yield batch

    def replica_info(self) -> dict[str, Any]:
        return replica_info()

    async def text_complete(self, request: CompletionRequest) -> dict[str, Any]:
        return await self.completions.complete(request)

    async def text_stream(self, request: CompletionRequest):
        async for batch in self.completions.stream(request):
            yield batch

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        return await self.tokens.tokenize(request)

    async def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        return await self.tokens.detokenize(request)


@serve.deployment(name="ChatProcessor", **copy.deepcopy(CHAT_PROCESSOR_DEFAULTS))
class ChatProcessor(Processing):
    def __init__(self, specs: list[ModelSpec], models: dict[str, DeploymentHandle], limits: Limits) -> None:
        super().__init__(specs, HandleModels(models), limits)


class HandleModels:
    """Models in deployments of their own, over their handles (one Ray hop per streamed item)."""

    def __init__(self, models: dict[str, DeploymentHandle]) -> None:
        self.models = models
        self.streams = {mid: h.options(stream=True) for mid, h in models.items()}

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[Any]:
        return relay(lambda: self.streams[model_id].generate.remote(request))

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]:
        try:
            return await self.models[model_id].tokenize.remote(text, add_special)
        except Exception as exc:  # noqa: BLE001
            raise to_api_error(exc) from None

    async def detokenize(self, model_id: str, tokens: list[int]) -> str:
        try:
            return await self.models[model_id].detokenize.remote(tokens)
        except Exception as exc:  # noqa: BLE001
            raise to_api_error(exc) from None


class LocalModels:
    """Models whose engines run in this very replica (`llama_model: ingress`): no Ray hop at all."""

    def __init__(self, hosts: dict[str, ModelHost]) -> None:
        self.hosts = hosts

    async def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[Any]:
        try:
            async for batch in self.hosts[model_id].generate(request, bounded=True):
                yield batch
        except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError, as over a handle
            raise to_api_error(exc) from None

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]:
        return await self.hosts[model_id].tokenize(text, add_special)

    async def detokenize(self, model_id: str, tokens: list[int]) -> str:
        return await self.hosts[model_id].detokenize(tokens)
