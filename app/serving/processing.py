"""The processing between the HTTP layer and the models: each API request planned (template, grammar,
limits), generated through the models, and shaped into its protocol's body or stream. One interface,
called the same way in the Ingress's own process (topology `single`) and over a Ray handle to the
ChatProcessor deployment (topology `graph`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, Union

from ..observe import tracing
from ..anthropic_messages import CountTokensRequest, MessagesRequest, MessagesService, MessageTokenCounter
from ..chat import ChatService
from ..completions import CompletionService
from ..embeddings import EmbeddingService
from ..api.embeddings import EmbeddingRequest
from ..api.rerank import RerankRequest
from ..rerank import RerankService
from ..config.settings import Limits, ModelSpec
from ..observe.request_records import NullObserver, RequestObserver
from ..api.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from ..openai_responses.retrieval import StoredResponses
from ..openai_responses.schemas import InputTokensRequest, ResponsesRequest
from ..openai_responses.service import InputTokensService, ResponsesService
from ..openai_responses.store import BoundedResponseStore, ResponseStore
from ..tokenize.service import TokenService
from ..generation.caller import Caller
from .models import Models

APIRequest = Union[ChatCompletionRequest, CompletionRequest, ResponsesRequest, MessagesRequest, EmbeddingRequest,
                   RerankRequest]
"""A request to a model: its type says which protocol answers it (embeddings and rerank only through `respond`)."""


class Processing(Protocol):
    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        """The whole reply body (`stream` false)."""

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of stream events. The first batch is empty: "accepted" (planning passed: the client's
        errors come before it), so the HTTP layer can send headers while the model is awaited."""

    async def tokenize(self, request: TokenizeRequest, caller: Caller) -> dict[str, Any]: ...

    async def detokenize(self, request: DetokenizeRequest, caller: Caller) -> dict[str, Any]: ...

    async def stored_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        """The caller's stored response object (GET /v1/responses/{id}); a 404 APIError if there is none."""

    async def delete_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        """Forget the caller's stored response (DELETE /v1/responses/{id}): OpenAI's deletion object; a 404
        APIError if there is none."""
    async def count_tokens(self, request: CountTokensRequest, caller: Caller) -> dict[str, Any]:
        """Anthropic's token count of a Messages request's prompt."""


class Processor:
    """Processing over `models`: each protocol's service, chosen by the request's type. `response_store`: where
    Responses API responses are kept (None: in this process, within the limits' bounds; the deployments pass
    the store actor that outlives replicas)."""

    def __init__(self, specs: list[ModelSpec], models: Models, limits: Limits, *,
                 observer: RequestObserver | None = None, per_key_cache: bool = True,
                 response_store: ResponseStore | None = None) -> None:
        observer = observer or NullObserver()
        if tracing.current().enabled:
            observer = tracing.RecordsOnSpans(observer)
        self.models = models
        if response_store is None:
            response_store = BoundedResponseStore.from_limits(limits)
        chat = ChatService(specs, models.generate, limits=limits, observer=observer, per_key_cache=per_key_cache)
        completions = CompletionService(specs, models.generate, limits=limits, observer=observer,
                                        per_key_cache=per_key_cache)
        responses = ResponsesService(specs, models.generate, limits=limits, observer=observer,
                                     per_key_cache=per_key_cache, response_store=response_store)
        messages = MessagesService(specs, models.generate, limits=limits, observer=observer,
                                   per_key_cache=per_key_cache)
        self.services: dict[type, Any] = {ChatCompletionRequest: chat, CompletionRequest: completions,
                                          ResponsesRequest: responses,
                                          InputTokensRequest: InputTokensService(responses, models),
                                          MessagesRequest: messages,
                                          EmbeddingRequest: EmbeddingService(specs, models, limits, observer),
                                          RerankRequest: RerankService(specs, models, limits, observer)}
        self.tokens = TokenService(specs, models, limits=limits)
        self.message_tokens = MessageTokenCounter(specs, models, limits=limits)
        self.response_store = response_store
        self.stored = StoredResponses(response_store)

    def _service(self, request: APIRequest) -> Any:
        return self.services[type(request)]

    async def respond(self, request: APIRequest, caller: Caller) -> dict[str, Any]:
        service = self._service(request)
        work = service.complete(request, caller)
        if not tracing.current().enabled:
            return await work
        return await tracing.awaited_in(_span(service, request, caller), work)

    def stream(self, request: APIRequest, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        service = self._service(request)
        events = service.stream(request, caller)
        if not tracing.current().enabled:
            return events
        return tracing.stream_in(_span(service, request, caller), events)

    async def tokenize(self, request: TokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.tokens.tokenize(request)

    async def detokenize(self, request: DetokenizeRequest, caller: Caller) -> dict[str, Any]:
        return await self.tokens.detokenize(request)

    async def stored_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        return await self.stored.get(response_id, caller)

    async def delete_response(self, response_id: str, caller: Caller) -> dict[str, Any]:
        return await self.stored.delete(response_id, caller)

    async def count_tokens(self, request: CountTokensRequest, caller: Caller) -> dict[str, Any]:
        return await self.message_tokens.count(request)


# OpenTelemetry's gen_ai.operation.name; a Responses or Messages request is a chat turn in its terms.
OPERATIONS = {"chat": "chat", "completions": "text_completion", "responses": "chat", "messages": "chat",
              "embeddings": "embeddings", "rerank": "rerank"}


def _span(service: Any, request: APIRequest, caller: Caller) -> Any:
    """The processing span of one request, child of the Ingress's (or its Ray hop's) span."""
    operation = OPERATIONS[service.protocol]
    attributes = {"llamaray.tier": "processor", "llamaray.protocol": service.protocol,
                  "gen_ai.operation.name": operation, "gen_ai.request.model": request.model,
                  "llamaray.stream": bool(getattr(request, "stream", False))}
    return tracing.current().start(f"{operation} {request.model}", parent=caller.traceparent, kind="server",
                                   attributes=attributes)
