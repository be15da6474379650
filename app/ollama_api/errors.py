"""Errors in Ollama's shape: `{"error": "<message>"}` with the status, on every path to the /api routes (the key
check and unknown methods included: the route table gives these routes this shape). Ollama's clients read the
status and show the message (the `ollama` package raises `ResponseError(error, status_code)`); a stream that fails
under way ends with one such line."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

from ..api.errors import APIError, as_api_error
from .schemas import OllamaChatRequest

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


# ---- errors named as the Ollama client sent the field ---------------------------------------------------------

def num_predict_named(exc: APIError) -> APIError:
    """A limit error about `max_tokens` named as the Ollama client set it (`options.num_predict`)."""
    if exc.param != "max_tokens":
        return exc
    return APIError(exc.message.replace("`max_tokens`", "`options.num_predict`"), param="options.num_predict",
                    code=exc.code, status=exc.status, type=exc.type)


_IMAGE_PART = re.compile(r"messages\[(\d+)\]\.content\[(\d+)\](?:\.image_url)?")


def images_named(exc: APIError, req: Any) -> APIError:
    """An error about an image part (`messages[i].content[j]`: the chat request's) named as the client sent the
    image: `messages[i].images[j]` (images come first in their message's parts), or /api/generate's `images[j]`."""
    def named(match: re.Match[str]) -> str:
        i, j = int(match.group(1)), int(match.group(2))
        if isinstance(req, OllamaChatRequest):
            images = req.messages[i].images or [] if i < len(req.messages) else []
            return f"messages[{i}].images[{j}]" if j < len(images) else match.group(0)
        generated = req.images or []  # type: ignore[attr-defined]
        prompt_turn = 1 if req.system else 0  # type: ignore[attr-defined]
        return f"images[{j}]" if i == prompt_turn and j < len(generated) else match.group(0)

    if exc.param is None or not _IMAGE_PART.search(exc.param):
        return exc
    return APIError(_IMAGE_PART.sub(named, exc.message), param=_IMAGE_PART.sub(named, exc.param), code=exc.code,
                    status=exc.status, type=exc.type, headers=exc.headers)
