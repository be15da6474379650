"""`POST /v1/embeddings` as data: OpenAI's request fields (and vLLM's `truncate_prompt_tokens`), and the
inputs read out of `input` with a 400 that names the one at fault."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from .errors import invalid_request
from .schemas import _Model


def _truncation(v: int | None) -> int | None:
    if v == 0:
        raise ValueError("must be -1 (the model's context) or a positive number of tokens")
    return v


# vLLM's `truncate_prompt_tokens`, as embeddings and rerank take it: -1 (the model's context) or a count.
TruncatePromptTokens = Annotated[int | None, Field(ge=-1), AfterValidator(_truncation)]


class EmbeddingRequest(_Model):
    model: str = Field(min_length=1)
    # A string, a list of strings, a list of token ids, or a list of lists of token ids: read by `inputs`,
    # which names the element at fault (a union's validation errors would name none).
    input: Any = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]})
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # vLLM's: keep the last k tokens of a longer input (-1: as many as the model's context holds) instead
    # of refusing it.
    truncate_prompt_tokens: TruncatePromptTokens = None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def inputs(raw: Any, max_inputs: int) -> tuple[tuple[str | tuple[int, ...], ...], bool]:
    """`input` as (inputs, single): texts or token-id tuples, and whether the request sent one input (its
    errors then name `input`). Empty texts and lists are refused, as OpenAI refuses them."""
    if isinstance(raw, str):
        if not raw:
            raise invalid_request("`input` is an empty string.", param="input", code="empty_input")
        return (raw,), True
    if not isinstance(raw, list):
        raise invalid_request("`input` must be a string, a list of strings, a list of token ids or a list of lists "
                              "of token ids.", param="input", code="invalid_type")
    if not raw:
        raise invalid_request("`input` is an empty list.", param="input", code="empty_input")
    if all(_is_id(x) for x in raw):
        return (tuple(raw),), True
    if len(raw) > max_inputs:
        raise invalid_request(f"`input` has {len(raw)} items; this server embeds at most {max_inputs} in one request "
                              f"(limits.max_embedding_inputs).", param="input", code="too_many_inputs")
    texts = isinstance(raw[0], str)
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if texts and isinstance(item, str):
            if not item:
                raise invalid_request(f"`{where}` is an empty string.", param=where, code="empty_input")
            out.append(item)
        elif not texts and isinstance(item, list) and all(_is_id(x) for x in item):
            if not item:
                raise invalid_request(f"`{where}` is an empty list of token ids.", param=where, code="empty_input")
            out.append(tuple(item))
        else:
            want = "a string, as input[0] is" if texts else "a list of token ids (integers)"
            raise invalid_request(f"`{where}` must be {want}.", param=where, code="invalid_type")
    return tuple(out), False
