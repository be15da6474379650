"""The OpenAPI document this server serves at /openapi.json: its own routes (the route table's, app/http/routes.py)
and request schemas (derived from the pydantic models), so tools such as schemathesis can exercise it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

_ERROR = {
    "description": "OpenAI-shaped error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
}
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
_MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
          "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                         "owned_by": {"type": "string"}}}


@dataclass(frozen=True)
class Doc:
    """A route with a JSON body, as the document shows it: its operationId, what its 200 answers, the name of its
    request's schema among the document's, and whether it also answers an SSE stream."""

    operation: str
    description: str
    schema: str
    stream: bool = False
    statuses: tuple[int, ...] = ()  # its errors besides every route's (403 and 409 of the admin routes)
    stream_media: str = "text/event-stream"  # a stream's media type (Ollama's routes: NDJSON)

    def operation_object(self, errors: dict[str, Any]) -> dict[str, Any]:
        errors = {**errors, **{str(code): _ERROR for code in self.statuses}}
        content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if self.stream:
            content[self.stream_media] = {"schema": {"type": "string"}}
        return {
            "operationId": self.operation,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{self.schema}"}}}},
            "responses": {"200": {"description": self.description, "content": content}, **errors},
        }


# The routes without a body, written out.
LIST_MODELS = {"operationId": "listModels", "responses": {
    "200": {"description": "Models", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"object": {"const": "list"},
                                         "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}}}},
    "401": _ERROR}}
RETRIEVE_MODEL = {
    "operationId": "retrieveModel",
    "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
    "responses": {"200": {"description": "A model", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Model"}}}}, "401": _ERROR, "404": _ERROR}}
HEALTH = {"operationId": "health", "responses": {
    "200": {"description": "Every model is loaded"}, "503": {"description": "Still loading"}}}
# GET and DELETE of a stored Responses API response (the caller's own; else 404).
_RESPONSE_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_FOUND = {"content": {"application/json": {"schema": {"type": "object"}}}}
GET_RESPONSE = {"operationId": "getResponse", "parameters": _RESPONSE_ID, "responses": {
    "200": {"description": "The response object as it was stored", **_FOUND},
    "400": _ERROR, "401": _ERROR, "404": _ERROR, "503": _ERROR}}
DELETE_RESPONSE = {"operationId": "deleteResponse", "parameters": _RESPONSE_ID, "responses": {
    "200": {"description": "`{id, object: response, deleted: true}`", **_FOUND},
    "401": _ERROR, "404": _ERROR, "503": _ERROR}}
USAGE = {"operationId": "getUsage", "responses": {
    "200": {"description": "`keys`: each key's usage by model (requests; prompt, cached and completion tokens), "
                           "requests in flight and token budget: every key for an admin key (or a server without "
                           "keys), the caller's own otherwise", **_FOUND},
    "401": _ERROR}}

METRICS = {"operationId": "metrics", "responses": {
    "200": {"description": "The node's Prometheus metrics: llamaray's own series and the vLLM-named ones, as Ray "
                           "exports them (`ray_llamaray_*`, `ray_vllm_*`), those of models the key may use",
            "content": {"text/plain": {"schema": {"type": "string"}}}},
    "401": _ERROR, "404": _ERROR, "503": _ERROR}}

# Ollama's routes without a body (app/ollama_api/catalogue.py); errors are `{"error": "..."}`.
_OLLAMA_ERROR = {"description": "Ollama-shaped error: `{\"error\": \"...\"}`",
                 "content": {"application/json": {"schema": {"type": "object", "required": ["error"],
                                                              "properties": {"error": {"type": "string"}}}}}}
OLLAMA_TAGS = {"operationId": "ollamaTags", "responses": {
    "200": {"description": "`models`: the models the key may use, named as Ollama names them", **_FOUND},
    "401": _OLLAMA_ERROR}}
OLLAMA_PS = {"operationId": "ollamaPs", "responses": {
    "200": {"description": "`models`: the models the key may use that are loaded now", **_FOUND},
    "401": _OLLAMA_ERROR}}
OLLAMA_VERSION = {"operationId": "ollamaVersion", "responses": {
    "200": {"description": "`version`: the Ollama API version these routes follow", **_FOUND}, "401": _OLLAMA_ERROR}}

# The admin routes (app/pools/admin.py): an admin key's only, else 403.
ADMIN_MODELS = {"operationId": "listPooledModels", "responses": {
    "200": {"description": "Each pooled model the key may use: its `state`, `pinned`, and `replicas` (each replica "
                           "holding it, with its state and pin)", **_FOUND},
    "401": _ERROR, "403": _ERROR, "503": _ERROR}}




def operation(operation_id: str, description: str, *, path: tuple[str, ...] = (), query: tuple[str, ...] = (),
              body: dict[str, Any] | None = None, media: str = "application/json",
              errors: tuple[int, ...] = (401, 404)) -> dict[str, Any]:
    """A route's operation written out (the batch routes: path and query parameters, a body that is not a
    pydantic model's)."""
    parameters = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in path]
    parameters += [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}} for n in query]
    out: dict[str, Any] = {"operationId": operation_id, "responses": {
        "200": {"description": description, "content": {media: {"schema": {"type": "object"} if media ==
                                                                "application/json" else {"type": "string"}}}},
        **{str(code): _ERROR for code in errors}}}
    if parameters:
        out["parameters"] = parameters
    if body is not None:
        out["requestBody"] = {"required": True, "content": body}
    return out


_MULTIPART = {"multipart/form-data": {"schema": {"type": "object", "required": ["file", "purpose"], "properties": {
    "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}}}}}
_JSON_OBJECT = {"application/json": {"schema": {"type": "object"}}}
# The batch routes (app/batches/, app/http/batch_routes.py): files, OpenAI's batches, Anthropic's Message Batches.
UPLOAD_FILE = operation("createFile", "The file object (`purpose: batch`), streamed to the batch store",
                        body=_MULTIPART, errors=(400, 401, 413, 415, 429))
LIST_FILES = operation("listFiles", "The key's files", query=("purpose", "limit", "order", "after"))
GET_FILE = operation("retrieveFile", "The file object", path=("file_id",))
DELETE_FILE = operation("deleteFile", "`{id, object: file, deleted: true}`", path=("file_id",), errors=(401, 404, 409))
FILE_CONTENT = operation("downloadFile", "The file's bytes (a batch's output and error files: JSON lines)",
                         path=("file_id",), media="application/octet-stream")
CREATE_BATCH = operation("createBatch", "The batch, `validating`", body=_JSON_OBJECT, errors=(400, 401, 404, 429))
LIST_BATCHES = operation("listBatches", "The key's batches, newest first", query=("after", "limit"))
GET_BATCH = operation("retrieveBatch", "The batch, with its `request_counts` so far", path=("batch_id",))
CANCEL_BATCH = operation("cancelBatch", "The batch, `cancelling`", path=("batch_id",), errors=(401, 404, 409))
CREATE_MESSAGE_BATCH = operation("createMessageBatch", "Anthropic's `message_batch`", body=_JSON_OBJECT,
                                 errors=(400, 401, 413, 429))
LIST_MESSAGE_BATCHES = operation("listMessageBatches", "The key's Message Batches, newest first",
                                 query=("after_id", "before_id", "limit"))
GET_MESSAGE_BATCH = operation("retrieveMessageBatch", "Anthropic's `message_batch`", path=("message_batch_id",))
DELETE_MESSAGE_BATCH = operation("deleteMessageBatch", "`{id, type: message_batch_deleted}`",
                                 path=("message_batch_id",), errors=(400, 401, 404))
CANCEL_MESSAGE_BATCH = operation("cancelMessageBatch", "Anthropic's `message_batch`, `canceling`",
                                 path=("message_batch_id",), errors=(401, 404, 409))
MESSAGE_BATCH_RESULTS = operation("messageBatchResults", "Each request's result, one JSON line each",
                                  path=("message_batch_id",), media="application/x-jsonl")


class DocumentedRoute(Protocol):
    path: str
    method: str
    request: type | None
    doc: Doc | dict[str, Any] | None


def openapi_path(path: str) -> str:
    """A Starlette path as OpenAPI writes it: `{model_id:path}` is `{model_id}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def openapi_document(routes: Iterable[DocumentedRoute], version: str = "0.1.0") -> dict[str, Any]:
    """The document of `routes` (the route table, app/http/routes.py): each route's operation, each request's
    schema (from its pydantic model)."""
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    errors = {str(code): _ERROR for code in (400, 401, 404, 413, 503, 504)}
    for route in routes:
        if route.doc is None:
            continue
        operation = route.doc
        if isinstance(operation, Doc):
            request = route.request.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
            components.update(request.pop("$defs", {}))
            components[operation.schema] = request
            operation = operation.operation_object(errors)
        paths.setdefault(openapi_path(route.path), {})[route.method.lower()] = operation
    components["ErrorResponse"] = _ERROR_SCHEMA
    components["Model"] = _MODEL
    return {
        "openapi": "3.1.0",
        "info": {"title": "llamaray", "version": version,
                 "description": "OpenAI- and Anthropic-compatible chat, Responses, Messages, completions, embeddings "
                                "and reranking on llama.cpp through Ray Serve."},
        "paths": paths,
        "components": {"schemas": components},
    }
