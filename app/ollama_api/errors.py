"""Errors in Ollama's shape: `{"error": "<message>"}` with the status, on every path to the /api routes (the key
check and unknown methods included: the route table gives these routes this shape). Ollama's clients read the
status and show the message (the `ollama` package raises `ResponseError(error, status_code)`); a stream that fails
under way ends with one such line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from ..api.errors import APIError, as_api_error

MANAGED_BY_CONFIG = ("a cluster's models come from its config (the serve config's `models:` and `pools:`), so "
                     "this server does not pull, push, create, copy or delete models; GET /api/tags lists the "
                     "models it serves")


def ollama_error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for any exception: an APIError as its status says, anything else a 500 that tells nothing
    of its cause."""
    api = as_api_error(exc)
    if api is None:
        return 500, {"error": "The server had an error while processing your request."}
    return api.status, {"error": api.message}


def model_not_found(name: str) -> APIError:
    """Ollama's wording for a model it does not have (clients match `not found`); the same for a model the key
    may not use."""
    shown = name if len(name) <= 200 else name[:200] + "..."
    return APIError(f'model "{shown}" not found (GET /api/tags lists the models this server serves)', status=404,
                    type="invalid_request_error", param="model", code="model_not_found")


def managed_by_config(route: str) -> APIError:
    """The refusal of a route that would change which models the server has (pull, push, create, copy, delete)."""
    return APIError(f"{route} is refused: {MANAGED_BY_CONFIG}.", status=403, type="invalid_request_error",
                    code="models_managed_by_config")


def refuse_management(route: str) -> Callable[[Any], NoReturn]:
    """The route table's reader of a refused route: refuses before the body is read (a blob upload is no JSON)."""
    def refuse(request: Any) -> NoReturn:
        raise managed_by_config(route)
    return refuse
