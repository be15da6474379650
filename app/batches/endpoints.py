"""What a batch's lines may ask for: each endpoint's request, read by the same parser as the HTTP route's (the same
strict schema, the same refusals), the model kind it needs, and whose error shape its failed lines carry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..anthropic_messages.errors import anthropic_error_body
from ..anthropic_messages.schemas import parse_messages_request
from ..api.embeddings import EmbeddingRequest
from ..api.errors import error_body
from ..api.schemas import CompletionRequest, parse_chat_request, parse_request
from ..openai_responses.schemas import parse_responses_request


@dataclass(frozen=True)
class Endpoint:
    url: str
    parse: Callable[[Any], Any]  # a line's decoded body -> the route's typed request (a 400 APIError if not)
    kind: str  # the model kind it needs (app/api/errors.py, served_model)
    errors: Callable[[BaseException], tuple[int, dict[str, Any]]] = error_body  # a failed line's status and body
    embeddings: bool = False  # a pooled pass (no generation, nothing to order by prefix)


ENDPOINTS: dict[str, Endpoint] = {e.url: e for e in (
    Endpoint("/v1/chat/completions", parse_chat_request, "chat"),
    Endpoint("/v1/completions", lambda body: parse_request(CompletionRequest, body), "chat"),
    Endpoint("/v1/embeddings", lambda body: parse_request(EmbeddingRequest, body), "embedding", embeddings=True),
    Endpoint("/v1/responses", parse_responses_request, "chat"),
)}
"""OpenAI's batch endpoints this server runs (the SDK's others, moderations, images and videos, it has no models
for)."""

MESSAGES = Endpoint("/v1/messages", parse_messages_request, "chat", anthropic_error_body)
"""A Message Batch's requests."""


def endpoint_of(url: str) -> Endpoint:
    return MESSAGES if url == MESSAGES.url else ENDPOINTS[url]
