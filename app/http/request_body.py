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


MAX_JSON_DEPTH = strict_json.MAX_DEPTH


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
    problem = strict_json.structure_problem(value, MAX_JSON_DEPTH)
    if problem:
        raise invalid_request(problem)
    return value
