"""The OpenAPI document this server serves at /openapi.json: its own routes and request schema
(derived from the pydantic models), so tools such as schemathesis can exercise it."""

from __future__ import annotations

from typing import Any

from ..anthropic_messages.schemas import CountTokensRequest, MessagesRequest
from ..api.embeddings import EmbeddingRequest
from ..api.rerank import RerankRequest
from ..api.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from ..openai_responses.schemas import InputTokensRequest, ResponsesRequest

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


def _post(operation: str, request: str, description: str, errors: dict[str, Any],
          stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {"post": {
        "operationId": operation,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {"200": {"description": description, "content": content}, **errors},
    }}


def _stored_response() -> dict[str, Any]:
    """GET and DELETE of a stored Responses API response (the caller's own; else 404)."""
    path = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    found = {"content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        "get": {"operationId": "getResponse", "parameters": path, "responses": {
            "200": {"description": "The response object as it was stored", **found},
            "400": _ERROR, "401": _ERROR, "404": _ERROR, "503": _ERROR}},
        "delete": {"operationId": "deleteResponse", "parameters": path, "responses": {
            "200": {"description": "`{id, object: response, deleted: true}`", **found},
            "401": _ERROR, "404": _ERROR, "503": _ERROR}},
    }


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    components: dict[str, Any] = {}
    for name, model in (("CreateChatCompletionRequest", ChatCompletionRequest),
                        ("CreateCompletionRequest", CompletionRequest), ("TokenizeRequest", TokenizeRequest),
                        ("DetokenizeRequest", DetokenizeRequest), ("CreateResponseRequest", ResponsesRequest),
                        ("ResponsesInputTokensRequest", InputTokensRequest),
                        ("CreateEmbeddingRequest", EmbeddingRequest), ("RerankRequest", RerankRequest),
                        ("CreateMessageRequest", MessagesRequest),
                        ("CountMessageTokensRequest", CountTokensRequest)):
        request = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        components.update(request.pop("$defs", {}))
        components[name] = request
    components["ErrorResponse"] = _ERROR_SCHEMA
    components["Model"] = _MODEL
    errors = {str(code): _ERROR for code in (400, 401, 404, 413, 503, 504)}
    return {
        "openapi": "3.1.0",
        "info": {"title": "llamaray", "version": version,
                 "description": "OpenAI- and Anthropic-compatible chat, Responses, Messages, completions, embeddings "
                                "and reranking on llama.cpp through Ray Serve."},
        "paths": {
            "/v1/chat/completions": {"post": {
                "operationId": "createChatCompletion",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateChatCompletionRequest"}}}},
                "responses": {"200": {"description": "A chat completion, or an SSE stream of chunks when `stream`",
                                      "content": {"application/json": {"schema": {"type": "object"}},
                                                  "text/event-stream": {"schema": {"type": "string"}}}},
                              **errors},
            }},
            "/v1/completions": _post("createCompletion", "CreateCompletionRequest",
                                     "A text_completion, or an SSE stream of them when `stream`", errors, stream=True),
            "/v1/responses": _post("createResponse", "CreateResponseRequest",
                                   "A response, or an SSE stream of typed events when `stream`", errors, stream=True),
            "/v1/responses/input_tokens": _post("countResponseInputTokens", "ResponsesInputTokensRequest",
                                                "`input_tokens`: the request's prompt, counted", errors),
            "/v1/messages": _post("createMessage", "CreateMessageRequest",
                                  "An Anthropic `message`, or an SSE stream of Anthropic's events when `stream` "
                                  "(errors in Anthropic's shape)", errors, stream=True),
            "/v1/messages/count_tokens": _post("countMessageTokens", "CountMessageTokensRequest",
                                               "`input_tokens`: the request's prompt, counted", errors),
            "/v1/embeddings": _post("createEmbedding", "CreateEmbeddingRequest",
                                    "A list of embeddings (an embedding model)", errors),
            **{path: _post(op, "RerankRequest", "`results`: each document's `index` and `relevance_score`, highest "
                           "first (a reranker)", errors)
               for path, op in (("/v1/rerank", "rerank"), ("/rerank", "rerankAlias"), ("/v2/rerank", "rerankV2"))},
            "/tokenize": _post("tokenize", "TokenizeRequest", "`tokens`, `count`, `max_model_len`", errors),
            "/detokenize": _post("detokenize", "DetokenizeRequest", "`prompt`: the tokens' text", errors),
            "/v1/models": {"get": {"operationId": "listModels", "responses": {
                "200": {"description": "Models", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"object": {"const": "list"},
                                                     "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}}}},
                "401": _ERROR}}},
            "/v1/models/{model_id}": {"get": {
                "operationId": "retrieveModel",
                "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "A model", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Model"}}}}, "401": _ERROR, "404": _ERROR}}},
            "/v1/responses/{response_id}": _stored_response(),
            "/health": {"get": {"operationId": "health", "responses": {
                "200": {"description": "Every model is loaded"}, "503": {"description": "Still loading"}}}},
        },
        "components": {"schemas": components},
    }
