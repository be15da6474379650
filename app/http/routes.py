"""The HTTP routes, in one table: each line is a path and method, the typed request it becomes, how it is read,
its protocol's error shape, how it is traced, and which handler answers it. The Starlette app, the paths the
Ingress traces, the paths whose errors are Anthropic's and the OpenAPI document are all made from it.

A new route is a request type, its service registered with the processing (`Processor.register`) and one
line here; the processing's clients (in process, over the Ray hop) only ever carry `respond`/`stream`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from starlette.requests import Request

from ..anthropic_messages.errors import anthropic_error_body
from ..anthropic_messages.schemas import (
    CountTokensRequest, MessagesRequest, parse_count_tokens_request, parse_messages_request,
)
from ..api.embeddings import EmbeddingRequest
from ..api.errors import error_body, invalid_request
from ..api.infill import InfillRequest
from ..api.rerank import RerankRequest
from ..batches.schemas import (
    BatchRequest, CancelBatchRequest, CreateBatchRequest, DeleteBatchRequest, DeleteFileRequest, FileRequest,
    ListBatchesRequest, ListFilesRequest, parse_create_batch,
)
from ..api.schemas import (
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, parse_chat_request, parse_request,
)
from ..openai_responses.schemas import (
    DeleteResponseRequest, InputTokensRequest, ResponsesRequest, StoredResponseRequest, parse_input_tokens_request,
    parse_responses_request,
)
from ..ollama_api.errors import ollama_error_body, refuse_management
from ..ollama_api.names import resolve_request
from ..ollama_api.schemas import (
    OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaGenerateRequest, OllamaPsRequest,
    OllamaShowRequest, OllamaTagsRequest, OllamaVersionRequest, parse_chat, parse_embed, parse_embeddings,
    parse_generate, parse_show,
)
from ..pools.admin import LoadModelRequest, PinModelRequest, PoolModelsRequest, UnloadModelRequest
from ..serving.tenancy import UsageRequest
from . import batch_routes as batches
from . import openapi as docs
from .ndjson import NDJSON
from .openapi import (
    ADMIN_MODELS, DELETE_RESPONSE, GET_RESPONSE, HEALTH, LIST_MODELS, METRICS, OLLAMA_PS, OLLAMA_TAGS, OLLAMA_VERSION,
    RETRIEVE_MODEL, USAGE, Doc,
)
from .responses_sse import ResponsesStream
from .sse import ANTHROPIC_MESSAGES, LLAMA_SERVER, OPENAI_CHAT, SSEDialect

ErrorShape = Callable[[BaseException], "tuple[int, dict[str, Any]]"]
"""A protocol's error: status and body for an exception (OpenAI's `error_body` unless the route says)."""


class Handler(Enum):
    """Which of the Ingress's handlers (app/http/endpoints.py, `Endpoints`, a method of this name) answers a route."""

    GENERATE = "generate"  # a JSON body: the whole answer, or an SSE stream when the request asks to `stream`
    ANSWER = "answer"  # a JSON body: the whole answer
    FROM_PATH = "from_path"  # the request is made from the path (and query): the whole answer
    # The batch routes' byte streams, which never cross a Ray hop (app/http/batch_routes.py)
    UPLOAD_FILE = "upload_file"
    FILE_CONTENT = "file_content"
    CREATE_MESSAGE_BATCH = "create_message_batch"
    MESSAGE_BATCH_RESULTS = "message_batch_results"
    LIST_MODELS = "list_models"  # the rest the Ingress answers itself
    GET_MODEL = "get_model"
    HEALTH = "health"
    OPENAPI = "openapi"
    METRICS = "metrics"  # the node's Prometheus metrics (llamaray's and the vLLM-named series)


class Trace(Enum):
    NONE = "none"
    INGRESS = "ingress"  # the Ingress's server span (a lookup: a token count, tokenize)
    HOPS = "hops"  # a generation: the Ingress's span and one for each Ray hop it crosses


class Framing:
    """A stream's SSE framing: its dialect, and the error event that ends a stream under way, made from the
    protocol's error body. Made once per request (the Responses API numbers the error after the last event)."""

    def __init__(self, dialect: SSEDialect) -> None:
        self.dialect = dialect

    def error_event(self, body: dict[str, Any]) -> dict[str, Any]:
        return body


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    handler: Handler
    request: type | None = None  # the typed request (None: the Ingress answers without the processing)
    parse: Callable[[Any], Any] | None = None  # the JSON body (FROM_PATH: the HTTP request) -> `request`
    errors: ErrorShape = error_body
    trace: Trace = Trace.NONE
    framing: Callable[[], Any] = functools.partial(Framing, OPENAI_CHAT)  # GENERATE: a streamed answer's SSE
    doc: Doc | dict[str, Any] | None = None  # in the OpenAPI document (a dict: the operation written out)
    admin: bool = False  # an admin key's only (KeyPolicy.admin; any caller of a server without keys), else 403
    # The request with its `model` named as configured, given a check of ids (configured and the key's to use),
    # or the protocol's 404 (Ollama's `name:tag`, app/ollama_api/names.py). None: the id exactly, else OpenAI's 404.
    resolve: Callable[[Any, Callable[[str], bool]], Any] | None = None

    def read(self, body: Any) -> Any:
        """The typed request from a decoded body: `parse`, or OpenAI's strict validation of `request`."""
        return self.parse(body) if self.parse is not None else parse_request(self.request, body)


def stored_response_request(request: Request) -> StoredResponseRequest:
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise invalid_request("Streaming a stored response is not supported: retrieve it without `stream`.",
                              param="stream")
    return StoredResponseRequest(request.path_params["response_id"])


def delete_response_request(request: Request) -> DeleteResponseRequest:
    return DeleteResponseRequest(request.path_params["response_id"])


# llama-server answers rerank at all three; vLLM at /rerank, /v1/rerank and /v2/rerank (Cohere's path).
_RERANK = (("/v1/rerank", "rerank"), ("/rerank", "rerankAlias"), ("/v2/rerank", "rerankV2"))
_COUNTED = "`input_tokens`: the request's prompt, counted"
_POOLED = ("The model's `state` (loaded, loading, available), `pinned`, and `replicas`: each replica holding it, with "
           "its state and pin")
_ADMIN_ERRORS = (403, 409)
G, A, H, P = Handler.GENERATE, Handler.ANSWER, Trace.HOPS, Handler.FROM_PATH
OLLAMA_PREFIX = "/api/"
_OLLAMA = {"errors": ollama_error_body, "resolve": resolve_request}
_NDJSON = functools.partial(Framing, NDJSON)
_OLLAMA_REFUSED = (("/api/pull", "POST"), ("/api/push", "POST"), ("/api/create", "POST"), ("/api/copy", "POST"),
                   ("/api/delete", "DELETE"), ("/api/blobs/{digest}", "POST"), ("/api/blobs/{digest}", "GET"))

# Starlette tries the paths in this order: /v1/responses/input_tokens before /v1/responses/{response_id}. The
# OpenAPI document collects the requests' schemas in this order too, and OpenAI's and Anthropic's `Tool` share
# a name there: the later (Anthropic's) is the one the document holds.
ROUTES: tuple[Route, ...] = (
    Route("/v1/chat/completions", "POST", G, ChatCompletionRequest, parse_chat_request, trace=H,
          doc=Doc("createChatCompletion", "A chat completion, or an SSE stream of chunks when `stream`",
                  "CreateChatCompletionRequest", stream=True)),
    Route("/v1/completions", "POST", G, CompletionRequest, trace=H,
          doc=Doc("createCompletion", "A text_completion, or an SSE stream of them when `stream`",
                  "CreateCompletionRequest", stream=True)),
    Route("/infill", "POST", G, InfillRequest, trace=H, framing=functools.partial(Framing, LLAMA_SERVER),
          doc=Doc("infill", "llama-server's fill-in-the-middle completion (`content`, `tokens_predicted`, "
                  "`tokens_evaluated`, `stop_type`, `timings`...), or an SSE stream of its partial objects ending "
                  "with the whole one when `stream`", "InfillRequest", stream=True)),
    Route("/v1/responses", "POST", G, ResponsesRequest, parse_responses_request, trace=H, framing=ResponsesStream,
          doc=Doc("createResponse", "A response, or an SSE stream of typed events when `stream`",
                  "CreateResponseRequest", stream=True)),
    Route("/v1/responses/input_tokens", "POST", A, InputTokensRequest, parse_input_tokens_request, trace=H,
          doc=Doc("countResponseInputTokens", _COUNTED, "ResponsesInputTokensRequest")),
    Route("/v1/responses/{response_id}", "GET", Handler.FROM_PATH, StoredResponseRequest, stored_response_request,
          doc=GET_RESPONSE),
    Route("/v1/responses/{response_id}", "DELETE", Handler.FROM_PATH, DeleteResponseRequest, delete_response_request,
          doc=DELETE_RESPONSE),
    Route("/v1/embeddings", "POST", A, EmbeddingRequest, trace=H,
          doc=Doc("createEmbedding", "A list of embeddings (an embedding model)", "CreateEmbeddingRequest")),
    *(Route(path, "POST", A, RerankRequest, trace=H, doc=Doc(
        operation, "`results`: each document's `index` and `relevance_score`, highest first (a reranker)",
        "RerankRequest")) for path, operation in _RERANK),
    Route("/tokenize", "POST", A, TokenizeRequest, trace=Trace.INGRESS,
          doc=Doc("tokenize", "`tokens`, `count`, `max_model_len`", "TokenizeRequest")),
    Route("/detokenize", "POST", A, DetokenizeRequest, trace=Trace.INGRESS,
          doc=Doc("detokenize", "`prompt`: the tokens' text", "DetokenizeRequest")),
    Route("/v1/messages", "POST", G, MessagesRequest, parse_messages_request, anthropic_error_body, H,
          functools.partial(Framing, ANTHROPIC_MESSAGES),
          doc=Doc("createMessage", "An Anthropic `message`, or an SSE stream of Anthropic's events when `stream` "
                  "(errors in Anthropic's shape)", "CreateMessageRequest", stream=True)),
    Route("/v1/messages/count_tokens", "POST", A, CountTokensRequest, parse_count_tokens_request,
          anthropic_error_body, Trace.INGRESS, doc=Doc("countMessageTokens", _COUNTED, "CountMessageTokensRequest")),
    Route("/v1/usage", "GET", Handler.FROM_PATH, UsageRequest, lambda request: UsageRequest(), doc=USAGE),
    # Batch jobs (app/batches/): files, OpenAI's batches, Anthropic's Message Batches. The byte streams (an upload,
    # a file's content, a Message Batch's body and results) the Ingress handles itself; the rest is the processing's.
    Route("/v1/files", "POST", Handler.UPLOAD_FILE, doc=docs.UPLOAD_FILE),
    Route("/v1/files", "GET", P, ListFilesRequest, batches.list_files_request, doc=docs.LIST_FILES),
    Route("/v1/files/{file_id}", "GET", P, FileRequest, batches.file_request, doc=docs.GET_FILE),
    Route("/v1/files/{file_id}", "DELETE", P, DeleteFileRequest, batches.delete_file_request, doc=docs.DELETE_FILE),
    Route("/v1/files/{file_id}/content", "GET", Handler.FILE_CONTENT, doc=docs.FILE_CONTENT),
    Route("/v1/batches", "POST", A, CreateBatchRequest, parse_create_batch, doc=docs.CREATE_BATCH),
    Route("/v1/batches", "GET", P, ListBatchesRequest, batches.list_batches_request, doc=docs.LIST_BATCHES),
    Route("/v1/batches/{batch_id}", "GET", P, BatchRequest, batches.batch_request, doc=docs.GET_BATCH),
    Route("/v1/batches/{batch_id}/cancel", "POST", P, CancelBatchRequest, batches.cancel_batch_request,
          doc=docs.CANCEL_BATCH),
    Route("/v1/messages/batches", "POST", Handler.CREATE_MESSAGE_BATCH, errors=anthropic_error_body,
          doc=docs.CREATE_MESSAGE_BATCH),
    Route("/v1/messages/batches", "GET", P, ListBatchesRequest, batches.list_message_batches_request,
          anthropic_error_body, doc=docs.LIST_MESSAGE_BATCHES),
    Route("/v1/messages/batches/{message_batch_id}", "GET", P, BatchRequest, batches.message_batch_request,
          anthropic_error_body, doc=docs.GET_MESSAGE_BATCH),
    Route("/v1/messages/batches/{message_batch_id}", "DELETE", P, DeleteBatchRequest,
          batches.delete_message_batch_request, anthropic_error_body, doc=docs.DELETE_MESSAGE_BATCH),
    Route("/v1/messages/batches/{message_batch_id}/cancel", "POST", P, CancelBatchRequest,
          batches.cancel_message_batch_request, anthropic_error_body, doc=docs.CANCEL_MESSAGE_BATCH),
    Route("/v1/messages/batches/{message_batch_id}/results", "GET", Handler.MESSAGE_BATCH_RESULTS,
          errors=anthropic_error_body, doc=docs.MESSAGE_BATCH_RESULTS),
    Route("/v1/models", "GET", Handler.LIST_MODELS, doc=LIST_MODELS),
    Route("/v1/models/{model_id:path}", "GET", Handler.GET_MODEL, doc=RETRIEVE_MODEL),
    Route("/health", "GET", Handler.HEALTH, doc=HEALTH),
    # The pools' admin routes (app/pools/admin.py): load, unload and pin a pooled model; where each is loaded.
    Route("/admin/models", "GET", Handler.FROM_PATH, PoolModelsRequest, lambda _: PoolModelsRequest(),
          doc=ADMIN_MODELS, admin=True),
    Route("/admin/models/load", "POST", A, LoadModelRequest, admin=True,
          doc=Doc("loadPooledModel", _POOLED, "LoadModelRequest", statuses=_ADMIN_ERRORS)),
    Route("/admin/models/unload", "POST", A, UnloadModelRequest, admin=True,
          doc=Doc("unloadPooledModel", _POOLED, "UnloadModelRequest", statuses=_ADMIN_ERRORS)),
    Route("/admin/models/pin", "POST", A, PinModelRequest, admin=True,
          doc=Doc("pinPooledModel", _POOLED, "PinModelRequest", statuses=_ADMIN_ERRORS)),
    Route("/openapi.json", "GET", Handler.OPENAPI),
    Route("/metrics", "GET", Handler.METRICS, doc=METRICS),
    # Ollama's API (app/ollama_api/): NDJSON streams, `{"error": ...}` errors, `name:tag` model names.
    Route("/api/chat", "POST", G, OllamaChatRequest, parse_chat, trace=H, framing=_NDJSON, **_OLLAMA,
          doc=Doc("ollamaChat", "Ollama's chat record, or an NDJSON stream of them (unless `stream: false`)",
                  "OllamaChatRequest", stream=True, stream_media="application/x-ndjson")),
    Route("/api/generate", "POST", G, OllamaGenerateRequest, parse_generate, trace=H, framing=_NDJSON, **_OLLAMA,
          doc=Doc("ollamaGenerate", "Ollama's generate record, or an NDJSON stream of them (unless `stream: false`)",
                  "OllamaGenerateRequest", stream=True, stream_media="application/x-ndjson")),
    Route("/api/embed", "POST", A, OllamaEmbedRequest, parse_embed, trace=H, **_OLLAMA,
          doc=Doc("ollamaEmbed", "`embeddings`: a vector per input", "OllamaEmbedRequest")),
    Route("/api/embeddings", "POST", A, OllamaEmbeddingsRequest, parse_embeddings, trace=H, **_OLLAMA,
          doc=Doc("ollamaEmbeddings", "`embedding`: the prompt's vector", "OllamaEmbeddingsRequest")),
    Route("/api/show", "POST", A, OllamaShowRequest, parse_show, **_OLLAMA,
          doc=Doc("ollamaShow", "The model's `details`, `model_info`, `template`, `parameters`, `capabilities`",
                  "OllamaShowRequest")),
    Route("/api/tags", "GET", Handler.FROM_PATH, OllamaTagsRequest, lambda _: OllamaTagsRequest(), ollama_error_body,
          doc=OLLAMA_TAGS),
    Route("/api/ps", "GET", Handler.FROM_PATH, OllamaPsRequest, lambda _: OllamaPsRequest(), ollama_error_body,
          doc=OLLAMA_PS),
    Route("/api/version", "GET", Handler.FROM_PATH, OllamaVersionRequest, lambda _: OllamaVersionRequest(),
          ollama_error_body, doc=OLLAMA_VERSION),
    *(Route(path, method, Handler.FROM_PATH, None, refuse_management(f"{method} {path}"), ollama_error_body)
      for path, method in _OLLAMA_REFUSED),
)


class RouteTable:
    """What the app derives from its routes: the lines of each path, the paths it traces, each path's error shape,
    and whether a request's Ray hops get spans."""

    def __init__(self, routes: Iterable[Route] = ROUTES) -> None:
        self.routes = tuple(routes)
        self.by_path: dict[str, dict[str, Route]] = {}
        for route in self.routes:
            self.by_path.setdefault(route.path, {})[route.method] = route
        self.traced_paths = frozenset(r.path for r in self.routes if r.trace is not Trace.NONE)
        self.hop_traced_types = frozenset(r.request for r in self.routes if r.trace is Trace.HOPS)
        # By the literal path: a path with parameters keeps OpenAI's shape, whatever its line says (but under
        # Ollama's prefix, where every path is Ollama's).
        self._shapes = {r.path: r.errors for r in self.routes}

    def error_shape(self, path: str) -> ErrorShape:
        """The error shape of the protocol a path belongs to, for errors found before its handler runs (a key,
        an unknown method, an unknown path)."""
        if path.startswith(OLLAMA_PREFIX):
            return ollama_error_body
        return self._shapes.get(path, error_body)

    def hop_traced(self, request: Any) -> bool:
        """Whether `request` crosses each Ray hop in a span of its own (a generation), or goes untraced there."""
        return type(request) in self.hop_traced_types


TABLE = RouteTable()
