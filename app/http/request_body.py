"""A request's JSON body, read within its limits: the size refused before it is all read, a JSON type that a web page
cannot send without asking, finite numbers only, nesting within MAX_JSON_DEPTH, and no lone surrogates."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..api import strict_json
from ..api.errors import invalid_request, payload_too_large
from .browser_guard import check_json_content_type


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes without reading them all into memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise payload_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise payload_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


MAX_JSON_DEPTH = 64


def _structure_problem(value: Any, limit: int) -> str | None:
    """What makes a parsed body unusable, checked in one pass: nesting past `limit`, or a string
    holding a lone UTF-16 surrogate (JSON's "\\ud800" escape), which is not text and cannot be encoded."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return "The JSON body contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid text."
            continue
        if isinstance(node, (dict, list)):
            if depth > limit:
                return f"The JSON body is nested too deeply (at most {limit} levels)."
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, str)))
    return None


async def read_json(request: Request, limit: int) -> Any:
    # Before reading: a form or text/plain body is what a web page can send without a preflight.
    check_json_content_type(request.headers.get("content-type"))
    raw = await _read_body(request, limit)
    try:
        # Finite numbers only: NaN, Infinity and 1e999 (read as inf) could not be written back as JSON.
        value = strict_json.loads(raw)
    except RecursionError:
        raise invalid_request(f"The JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels).") from None
    except strict_json.NonFiniteNumber as exc:
        raise invalid_request(f"We could not parse the JSON body of your request: {exc}. JSON numbers must be "
                              "finite.", code="non_finite_number") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request(
            f"We could not parse the JSON body of your request: {exc}. "
            "The body must be valid JSON (Content-Type: application/json)."
        ) from None
    problem = _structure_problem(value, MAX_JSON_DEPTH)
    if problem:
        raise invalid_request(problem)
    return value
