"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}, "request_id"}`, with
Anthropic's statuses. The same APIErrors as every route raises, told the way Anthropic's clients read them:
their SDK picks its exception by status (529: overloaded), a stream's `error` event by `error.type`."""

from __future__ import annotations

import uuid
from typing import Any

from ..api.errors import as_api_error

OVERLOADED = 529  # Anthropic's status for "overloaded, retry"

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
          OVERLOADED: "overloaded_error"}


def error_status(status: int, code: str | None) -> int:
    """Our status as Anthropic's: an overloaded server is 529, everything else keeps its status."""
    return OVERLOADED if status == 503 and code == "overloaded" else status


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message},
            "request_id": f"req_{uuid.uuid4().hex}"}


def anthropic_error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for any exception (the Anthropic routes' `error_body`): an APIError as its status
    says, anything else a 500 `api_error` that tells nothing of its cause."""
    api = as_api_error(exc)
    if api is None:
        return 500, anthropic_error(500, "The server had an error while processing your request.")
    status = error_status(api.status, api.code)
    return status, anthropic_error(status, api.message)
