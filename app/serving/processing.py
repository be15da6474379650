"""The processing between the HTTP layer and the models: each API request planned (template, grammar,
limits), generated through the models, and shaped into its protocol's body or stream. One interface,
called the same way in the Ingress's own process (topology `single`) and over a Ray handle to the
ChatProcessor deployment (topology `graph`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, Union

from ..chat import ChatService
from ..completions import CompletionService
from ..config import Limits, ModelSpec
from ..observe import NullObserver, RequestObserver
from ..schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from ..tokens import TokenService
from .caller import Caller
from .models import Models

APIRequest = Union[ChatCompletionRequest, CompletionRequest]
"""A request that generates: its type says which protocol answers it."""


class Processing(Protocol):
    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        """The whole reply body (`stream` false)."""

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of stream events. The first batch is empty: "accepted" (planning passed: the client's
        errors come before it), so the HTTP layer can send headers while the model is awaited."""

    async def tokenize(self, request: TokenizeRequest, caller: Caller) -> dict[str, Any]: ...

    async def detokenize(self, request: DetokenizeRequest, caller: Caller) -> dict[str, Any]: ...


class Processor:
    """Processing over `models`: each protocol's service, chosen by the request's type."""

    def __init__(self, specs: list[ModelSpec], models: Models, limits: Limits, *,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        observer = observer or NullObserver()
        self.models = models
        chat = ChatService(specs, models.open_stream, limits=limits, observer=observer, per_key_cache=per_key_cache)
        completions = CompletionService(specs, models.open_stream, limits=limits, observer=observer,
                                        per_key_cache=per_key_cache)
        self.services: dict[type, Any] = {ChatCompletionRequest: chat, CompletionRequest: completions}
        self.tokens = TokenService(specs, models, limits=limits)

    def _service(self, request: APIRequest) -> Any:
        return self.services[type(request)]

    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        return await self._service(request).complete(request, caller)

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        return self._service(request).stream(request, caller)

    async def tokenize(self, request: TokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.tokens.tokenize(request)

    async def detokenize(self, request: DetokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.tokens.detokenize(request)
