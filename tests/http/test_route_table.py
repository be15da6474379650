"""The route table is the one list of routes: the app's paths, its traced paths, its Anthropic-shaped paths and
its OpenAPI document are all read from it, and say what they said when each was written out by hand."""

from __future__ import annotations

from app.anthropic_messages.errors import anthropic_error_body
from app.api.errors import error_body
from app.ollama_api.errors import ollama_error_body
from app.http.openapi import openapi_document
from app.http.routes import ROUTES, TABLE
from app.http.app import build_http_app
from app.http.model_cards import ModelCard

OPERATIONS = {
    ("/v1/chat/completions", "post"): "createChatCompletion", ("/v1/completions", "post"): "createCompletion",
    ("/infill", "post"): "infill",
    ("/v1/responses", "post"): "createResponse", ("/v1/responses/input_tokens", "post"): "countResponseInputTokens",
    ("/v1/responses/{response_id}", "get"): "getResponse", ("/v1/responses/{response_id}", "delete"): "deleteResponse",
    ("/v1/messages", "post"): "createMessage", ("/v1/messages/count_tokens", "post"): "countMessageTokens",
    ("/v1/embeddings", "post"): "createEmbedding", ("/v1/rerank", "post"): "rerank", ("/rerank", "post"): "rerankAlias",
    ("/v2/rerank", "post"): "rerankV2", ("/tokenize", "post"): "tokenize", ("/detokenize", "post"): "detokenize",
    ("/v1/models", "get"): "listModels", ("/v1/models/{model_id}", "get"): "retrieveModel",
    ("/health", "get"): "health", ("/v1/usage", "get"): "getUsage",
    ("/admin/models", "get"): "listPooledModels", ("/admin/models/load", "post"): "loadPooledModel",
    ("/admin/models/unload", "post"): "unloadPooledModel", ("/admin/models/pin", "post"): "pinPooledModel",
    ("/metrics", "get"): "metrics",
    ("/api/chat", "post"): "ollamaChat", ("/api/generate", "post"): "ollamaGenerate",
    ("/api/embed", "post"): "ollamaEmbed", ("/api/embeddings", "post"): "ollamaEmbeddings",
    ("/api/show", "post"): "ollamaShow", ("/api/tags", "get"): "ollamaTags", ("/api/ps", "get"): "ollamaPs",
    ("/api/version", "get"): "ollamaVersion",
    ("/v1/files", "post"): "createFile", ("/v1/files", "get"): "listFiles", ("/v1/files/{file_id}", "get"): "retrieveFile",
    ("/v1/files/{file_id}", "delete"): "deleteFile", ("/v1/files/{file_id}/content", "get"): "downloadFile",
    ("/v1/batches", "post"): "createBatch", ("/v1/batches", "get"): "listBatches",
    ("/v1/batches/{batch_id}", "get"): "retrieveBatch", ("/v1/batches/{batch_id}/cancel", "post"): "cancelBatch",
    ("/v1/messages/batches", "post"): "createMessageBatch", ("/v1/messages/batches", "get"): "listMessageBatches",
    ("/v1/messages/batches/{message_batch_id}", "get"): "retrieveMessageBatch",
    ("/v1/messages/batches/{message_batch_id}", "delete"): "deleteMessageBatch",
    ("/v1/messages/batches/{message_batch_id}/cancel", "post"): "cancelMessageBatch",
    ("/v1/messages/batches/{message_batch_id}/results", "get"): "messageBatchResults",
}


def test_the_openapi_document_lists_every_documented_route():
    doc = openapi_document(ROUTES)
    assert {(path, method): op["operationId"] for path, ops in doc["paths"].items()
            for method, op in ops.items()} == OPERATIONS
    assert {"CreateChatCompletionRequest", "CreateCompletionRequest", "InfillRequest", "TokenizeRequest", "DetokenizeRequest",
            "CreateResponseRequest", "ResponsesInputTokensRequest", "CreateEmbeddingRequest", "RerankRequest",
            "CreateMessageRequest", "CountMessageTokensRequest", "ErrorResponse", "Model"} <= set(
        doc["components"]["schemas"])


def test_traced_and_anthropic_paths_come_from_the_table():
    assert TABLE.traced_paths == {"/v1/chat/completions", "/v1/completions", "/infill", "/v1/embeddings", "/v1/rerank", "/rerank",
                                  "/v2/rerank", "/tokenize", "/detokenize", "/v1/responses",
                                  "/v1/responses/input_tokens", "/v1/messages", "/v1/messages/count_tokens",
                                  "/api/chat", "/api/generate", "/api/embed", "/api/embeddings"}
    anthropic = {r.path for r in ROUTES if TABLE.error_shape(r.path) is anthropic_error_body}
    assert anthropic == {"/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches",
                         "/v1/messages/batches/{message_batch_id}", "/v1/messages/batches/{message_batch_id}/cancel",
                         "/v1/messages/batches/{message_batch_id}/results"}
    assert TABLE.error_shape("/v1/unknown") is error_body
    ollama = {r.path for r in ROUTES if TABLE.error_shape(r.path) is ollama_error_body}
    assert ollama == {r.path for r in ROUTES if r.path.startswith("/api/")}
    assert TABLE.error_shape("/api/unknown") is ollama_error_body  # every path under Ollama's prefix


def test_the_app_serves_each_path_of_the_table_once_with_all_its_methods():
    app = build_http_app(object(), [ModelCard("m")])
    served = {route.path: route.methods for route in app.routes}
    assert list(served) == list(TABLE.by_path)
    assert served["/v1/responses/{response_id}"] == {"GET", "HEAD", "DELETE"}
