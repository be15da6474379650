"""`POST /v1/rerank` (also /rerank, /v2/rerank) as data: the request llama-server, vLLM and Cohere share, and
its documents read out with a 400 that names the one at fault."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .errors import invalid_request
from .embeddings import TruncatePromptTokens
from .schemas import _Model


class RerankRequest(_Model):
    model: str = Field(min_length=1)
    query: str
    # Strings, or Cohere's {"text": ...} objects: read by `documents`, which names the one at fault.
    documents: Any = Field(json_schema_extra={"type": "array", "items": {"anyOf": [
        {"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}]}})
    top_n: int | None = Field(default=None, ge=1)
    # Each result's `document: {"text"}`. Off by default, as llama-server (which never sends it) and Cohere
    # answer; vLLM always sends it.
    return_documents: bool = False
    # vLLM's: cut a pair longer than k tokens (-1: the model's context) at its document's end instead of
    # refusing it.
    truncate_prompt_tokens: TruncatePromptTokens = None
    user: str | None = None


def documents(raw: Any, max_documents: int) -> tuple[str, ...]:
    """`documents` as texts; a 400 naming `documents[i]` for an empty or malformed one."""
    if not isinstance(raw, list):
        raise invalid_request("`documents` must be a list of strings (or of {\"text\": ...} objects).",
                              param="documents", code="invalid_type")
    if not raw:
        raise invalid_request("`documents` is an empty list.", param="documents", code="empty_input")
    if len(raw) > max_documents:
        raise invalid_request(f"`documents` has {len(raw)} items; this server reranks at most {max_documents} in one "
                              f"request (limits.max_rerank_documents).", param="documents", code="too_many_inputs")
    out = []
    for i, item in enumerate(raw):
        where = f"documents[{i}]"
        text = item.get("text") if isinstance(item, dict) and set(item) == {"text"} else item
        if not isinstance(text, str):
            raise invalid_request(f"`{where}` must be a string or a {{\"text\": string}} object.", param=where,
                                  code="invalid_type")
        if not text:
            raise invalid_request(f"`{where}` is an empty string.", param=where, code="empty_input")
        out.append(text)
    return tuple(out)
