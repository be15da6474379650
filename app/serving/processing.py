"""The processing between the HTTP layer and the models: each API request planned (template, grammar,
limits), generated through the models, and shaped into its protocol's body or stream. One interface,
called the same way in the Ingress's own process (topology `single`) and over a Ray handle to the
ChatProcessor deployment (topology `graph`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..observe import tracing
from ..anthropic_messages import CountTokensRequest, MessagesRequest, MessagesService, MessageTokenCounter
from ..chat import ChatService
from ..completions import CompletionService
from ..completions.infill import InfillService
from ..embeddings import EmbeddingService
from ..api.embeddings import EmbeddingRequest
from ..api.infill import InfillRequest
from ..api.rerank import RerankRequest
from ..rerank import RerankService
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..observe.request_records import NullObserver, RequestObserver
from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from ..ollama_api import (
    OllamaCatalogue, OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaEmbedService,
    OllamaGenerateRequest, OllamaPsRequest, OllamaService, OllamaShowRequest, OllamaTagsRequest, OllamaVersionRequest,
)
from ..openai_responses.retrieval import StoredResponses
from ..openai_responses.schemas import (
    DeleteResponseRequest, InputTokensRequest, ResponsesRequest, StoredResponseRequest,
)
from ..openai_responses.service import InputTokensService, ResponsesService
from ..openai_responses.store import BoundedResponseStore, ResponseStore
from ..pools.admin import (
    LoadModelRequest, PinModelRequest, PoolAdmin, PoolModelsRequest, PoolReplicas, UnloadModelRequest, local_replicas,
)
from ..batches.service import BatchService, answers as batch_answers
from ..tokenize.service import TokenService
from ..generation.caller import Caller
from .models import Models
from .tenancy import Tenancy, UsageRequest

class Processing(Protocol):
    """Two verbs, whatever is asked: the request's type says what (a chat turn, a token count, a stored
    response, its deletion...), and the processing answers it with the service registered for that type."""

    async def respond(self, request: Any, caller: Caller) -> dict[str, Any]:
        """The whole reply body (`stream` false, or a request that never streams)."""

    def stream(self, request: Any, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of stream events. The first batch is empty: "accepted" (planning passed: the client's
        errors come before it), so the HTTP layer can send headers while the model is awaited."""


@dataclass(frozen=True)
class Answer:
    """What answers one request type: `respond(request, caller)` the whole body, `stream(request, caller)` its
    events (None: it never streams). `protocol`: a generation's protocol, which names its processing span (None:
    a lookup, answered without one)."""

    respond: Callable[[Any, Caller], Awaitable[dict[str, Any]]]
    stream: Callable[[Any, Caller], AsyncIterator[list[dict[str, Any]]]] | None = None
    protocol: str | None = None
    metered: bool = False  # counted against its key's limits (app/serving/tenancy.py): what uses a model's time


def generation(service: Any, metered: bool = True) -> Answer:
    """A protocol's service: `complete`, `stream` if it has one, and its `protocol`. `metered`: False for a
    count that takes no model time worth limiting (Responses' input_tokens)."""
    return Answer(service.complete, getattr(service, "stream", None), service.protocol, metered)


class Processor:
    """Processing over `models`: the registry of request types, each answered by its service. `response_store`:
    where Responses API responses are kept (None: in this process, within the limits' bounds; the deployments
    pass the store actor that outlives replicas). `tenancy`: each key's limits and usage (None: not counted).
    `pool_replicas`: each pool's running replicas, which the admin routes reach one by one (default: the pools
    are in this process). `batches`: the batch routes' service over the batch store (None: batch jobs are off)."""

    def __init__(self, specs: list[ModelSpec], models: Models, limits: Limits, *,
                 observer: RequestObserver | None = None, per_key_cache: bool = True,
                 response_store: ResponseStore | None = None, tenancy: Tenancy | None = None,
                 pool_replicas: PoolReplicas = local_replicas, batches: BatchService | None = None) -> None:
        observer = observer or NullObserver()
        if tracing.current().enabled:
            observer = tracing.RecordsOnSpans(observer)
        self.tenancy = tenancy
        if tenancy is not None:
            observer = tenancy.observing(observer)
        self.models = models
        if response_store is None:
            response_store = BoundedResponseStore.from_limits(limits)
        self.response_store = response_store
        chat = ChatService(specs, models.generate, limits=limits, observer=observer, per_key_cache=per_key_cache)
        completions = CompletionService(specs, models.generate, limits=limits, observer=observer,
                                        per_key_cache=per_key_cache)
        infill = InfillService(specs, models.generate, limits=limits, observer=observer, per_key_cache=per_key_cache)
        responses = ResponsesService(specs, models.generate, limits=limits, observer=observer,
                                     per_key_cache=per_key_cache, response_store=response_store)
        messages = MessagesService(specs, models.generate, limits=limits, observer=observer,
                                   per_key_cache=per_key_cache)
        tokens = TokenService(specs, models, limits=limits)
        stored = StoredResponses(response_store)
        pools = PoolAdmin(specs, models.run, pool_replicas)
        ollama = OllamaService(specs, models.generate, limits=limits, observer=observer, per_key_cache=per_key_cache,
                               pools=pools)
        ollama_embed = OllamaEmbedService(specs, models, limits, observer, pools)
        ollama_models = OllamaCatalogue(specs, pools)
        self.answers: dict[type, Answer] = {}
        for request_type, answer in (
                (ChatCompletionRequest, generation(chat)),
                (CompletionRequest, generation(completions)),
                (InfillRequest, generation(infill)),
                (ResponsesRequest, generation(responses)),
                (InputTokensRequest, generation(InputTokensService(responses, models), metered=False)),
                (MessagesRequest, generation(messages)),
                (EmbeddingRequest, generation(EmbeddingService(specs, models, limits, observer))),
                (RerankRequest, generation(RerankService(specs, models, limits, observer))),
                (TokenizeRequest, Answer(tokens.tokenize)),
                (DetokenizeRequest, Answer(tokens.detokenize)),
                (CountTokensRequest, Answer(MessageTokenCounter(specs, models, limits=limits).count)),
                (StoredResponseRequest, Answer(stored.get)),
                (DeleteResponseRequest, Answer(stored.delete)),
                (UsageRequest, Answer(self._usage)),
                (LoadModelRequest, Answer(pools.load)),
                (UnloadModelRequest, Answer(pools.unload)),
                (PinModelRequest, Answer(pools.pin)),
                (PoolModelsRequest, Answer(pools.list)),
                (OllamaChatRequest, generation(ollama)),
                (OllamaGenerateRequest, generation(ollama)),
                (OllamaEmbedRequest, Answer(ollama_embed.embed, protocol=ollama_embed.protocol, metered=True)),
                (OllamaEmbeddingsRequest, Answer(ollama_embed.legacy, protocol=ollama_embed.protocol, metered=True)),
                (OllamaShowRequest, Answer(ollama_models.show)),
                (OllamaTagsRequest, Answer(ollama_models.tags)),
                (OllamaPsRequest, Answer(ollama_models.ps)),
                (OllamaVersionRequest, Answer(ollama_models.version))):
            self.register(request_type, answer)
        for request_type, respond in batch_answers(batches).items():  # the batch routes (app/batches/service.py)
            self.register(request_type, Answer(respond))

    async def _usage(self, request: UsageRequest, caller: Caller) -> dict[str, Any]:
        if self.tenancy is None:
            return {"object": "usage", "keys": {}, "degraded": False}
        return await self.tenancy.usage(request, caller)

    def register(self, request_type: type, answer: Answer) -> None:
        """`request_type` answered by `answer` from now on: a new route's whole processing side."""
        self.answers[request_type] = answer

    def _answer(self, request: Any) -> Answer:
        answer = self.answers.get(type(request))  # the exact type: an InputTokensRequest is a ResponsesRequest too
        if answer is None:
            raise TypeError(f"No service is registered for {type(request).__name__} (Processor.register).")
        return answer

    async def respond(self, request: Any, caller: Caller) -> dict[str, Any]:
        answer = self._answer(request)
        if answer.metered and self.tenancy is not None:
            work = self.tenancy.admitted(caller, answer.protocol or "", lambda: answer.respond(request, caller))
        else:
            work = answer.respond(request, caller)
        if answer.protocol is None or not tracing.current().enabled:
            return await work
        return await tracing.awaited_in(_span(answer.protocol, request, caller), work)

    def stream(self, request: Any, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        answer = self._answer(request)
        if answer.stream is None:
            raise invalid_request(f"A {type(request).__name__} cannot be streamed: ask for the whole answer.",
                                  param="stream")
        if answer.metered and self.tenancy is not None:
            stream = answer.stream
            events = self.tenancy.streamed(caller, answer.protocol or "", lambda: stream(request, caller))
        else:
            events = answer.stream(request, caller)
        if answer.protocol is None or not tracing.current().enabled:
            return events
        return tracing.stream_in(_span(answer.protocol, request, caller), events)


# OpenTelemetry's gen_ai.operation.name; a Responses or Messages request is a chat turn in its terms.
OPERATIONS = {"chat": "chat", "completions": "text_completion", "infill": "text_completion", "responses": "chat",
              "messages": "chat", "embeddings": "embeddings", "rerank": "rerank", "ollama": "chat",
              "ollama_embed": "embeddings"}


def _span(protocol: str, request: Any, caller: Caller) -> Any:
    """The processing span of one request, child of the Ingress's (or its Ray hop's) span."""
    operation = OPERATIONS[protocol]
    attributes = {"llamaray.tier": "processor", "llamaray.protocol": protocol,
                  "gen_ai.operation.name": operation, "gen_ai.request.model": request.model,
                  "llamaray.stream": bool(getattr(request, "stream", False))}
    return tracing.current().start(f"{operation} {request.model}", parent=caller.traceparent, kind="server",
                                   attributes=attributes)
