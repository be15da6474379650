"""OpenAI-shaped errors: one exception type that knows its HTTP status and JSON body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.errors import ContextExceeded, EngineError
from ..tenants.access import may_use
from ..tenants.policies import KeyPolicy


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        logged: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        # Already in a server log with its cause (where it was made): the HTTP layer logs every 5xx it
        # sends, once, and skips those.
        self.logged = logged
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):  # keep status/param/code/headers when pickled across Ray hops
        return (_rebuild, (self.message, self.param, self.code, self.status, self.type, self.headers, self.logged))

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.type}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def _rebuild(message: str, param: str | None, code: str | None, status: int, type: str,
             headers: dict[str, str] | None = None, logged: bool = False) -> APIError:
    return APIError(message, param=param, code=code, status=status, type=type, headers=headers, logged=logged)


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, param=param, code=code, status=400, type="invalid_request_error")


def model_not_found(model: str) -> APIError:
    return APIError(
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
        status=404,
        type="invalid_request_error",
    )


# What each model kind is, and the routes it serves.
KIND_SERVES = {"chat": ("a chat model", "/v1/chat/completions, /v1/completions, /v1/responses and /v1/messages"),
               "embedding": ("an embedding model", "/v1/embeddings"),
               "rerank": ("a reranker", "/v1/rerank")}


def wrong_kind(model: str, kind: str, route: str) -> APIError:
    """A model asked for what its kind does not do: `kind` is the model's ("chat", "embedding", "rerank"),
    `route` what was asked ("/v1/embeddings", "chat completions")."""
    what, serves = KIND_SERVES.get(kind, KIND_SERVES["chat"])
    return invalid_request(f"Model `{model}` is {what}: it serves {serves}, not {route}.", param="model",
                           code="unsupported_model")


def served_model(models: Mapping[str, Any], model: str, kind: str, route: str,
                 policy: KeyPolicy | None = None) -> Any:
    """The one check every route makes of `model`: configured and one the key's `policy` allows (else 404:
    another key's model is unknown to this one, as OpenAI answers) and of the `kind` the route serves (else a
    400 naming what it does serve). `models` maps ids to ModelSpecs."""
    spec = models.get(model)
    if spec is None or not may_use(policy, model):
        raise model_not_found(model)
    if spec.kind != kind:
        raise wrong_kind(spec.id, spec.kind, route)
    return spec


def not_found(message: str) -> APIError:
    return APIError(message, status=404, type="invalid_request_error", code="not_found")


def context_length_exceeded(n_ctx: int, prompt_tokens: int, max_tokens: int | None, at_least: bool = False) -> APIError:
    """at_least: `prompt_tokens` is a lower bound (what the prompt's size proves before tokenizing it)."""
    some = "at least " if at_least else ""
    if max_tokens is None:
        detail = f"your messages resulted in {some}{prompt_tokens} tokens"
    else:
        detail = (
            f"you requested {some}{prompt_tokens + max_tokens} tokens "
            f"({some}{prompt_tokens} in the messages, {max_tokens} in the completion)"
        )
    return APIError(
        f"This model's maximum context length is {n_ctx} tokens. However, {detail}. "
        "Please reduce the length of the messages or completion.",
        param="messages",
        code="context_length_exceeded",
        status=400,
        type="invalid_request_error",
    )


def service_unavailable(message: str, *, code: str = "service_unavailable") -> APIError:
    return APIError(message, status=503, type="server_error", code=code)


def overloaded(message: str = "The server is overloaded; retry shortly.", retry_after_s: int = 1) -> APIError:
    return APIError(message, status=503, type="server_error", code="overloaded",
                    headers={"Retry-After": str(retry_after_s)})


def timeout_error(seconds: float) -> APIError:
    return APIError(f"The request did not finish within its {seconds:g} s deadline.", status=504,
                    type="server_error", code="timeout")


EMPTY_REPLY = "upstream_empty_response"


def empty_reply() -> APIError:
    """A reply with nothing in it (a model's `empty_reply: error`): a 502, as a proxy answers for an
    upstream that sent nothing, so clients retry it like any other upstream failure."""
    return APIError("The model returned an empty reply (no content, reasoning or tool calls); retry the request.",
                    status=502, type="server_error", code=EMPTY_REPLY)


def unauthorized() -> APIError:
    return APIError("Incorrect or missing API key. Send `Authorization: Bearer <key>` or `x-api-key: <key>`.", status=401,
                    type="invalid_request_error", code="invalid_api_key")


def forbidden(message: str) -> APIError:
    """A valid key without the permission the route needs (OpenAI's 403 for a key lacking a scope)."""
    return APIError(message, status=403, type="invalid_request_error", code="insufficient_permissions")


def model_busy(message: str, retry_after_s: int = 2) -> APIError:
    """An operation on a model that its requests in flight keep from happening now (an unload): 409, retry."""
    return APIError(message, status=409, type="invalid_request_error", code="model_busy",
                    headers={"Retry-After": str(retry_after_s)})


def payload_too_large(limit: int) -> APIError:
    return APIError(f"The request body is larger than the {limit} bytes this server accepts.", status=413,
                    type="invalid_request_error", code="request_too_large")


def internal_error(message: str = "The server had an error while processing your request.", *,
                   logged: bool = False) -> APIError:
    """`logged`: the caller has logged the cause (with its traceback) already."""
    return APIError(message, status=500, type="server_error", code="internal_error", logged=logged)


# The request field a client knows an engine error's subject by, where the two differ: a prompt's images
# are parts of its messages.
ENGINE_SUBJECT_PARAMS = {"images": "messages"}


def from_engine_error(exc: EngineError) -> APIError:
    """The protocol's error for an engine error (app/engine/errors.py): its kind gives the status and type,
    its subject the request field (`param`), its code and message pass on as they are."""
    if isinstance(exc, ContextExceeded):
        return context_length_exceeded(exc.n_ctx, exc.prompt_tokens, exc.max_tokens, at_least=exc.at_least)
    param = ENGINE_SUBJECT_PARAMS.get(exc.subject, exc.subject) if exc.subject is not None else None
    if exc.kind == "bad_input":
        return invalid_request(exc.message, param=param, code=exc.code)
    if exc.kind == "not_found":
        return APIError(exc.message, param=param, code=exc.code, status=404, type="invalid_request_error")
    if exc.kind == "overloaded":
        busy = overloaded(exc.message)
        busy.code = exc.code or busy.code  # a batch line sent back (batch_preempted, batch_deferred) says so
        return busy
    if exc.kind == "unavailable":
        return service_unavailable(exc.message, code=exc.code or "service_unavailable")
    if exc.kind == "timeout":
        return APIError(exc.message, status=504, type="server_error", code=exc.code or "timeout")
    return APIError(exc.message, status=500, type="server_error", code=exc.code or "internal_error",
                    logged=exc.logged)


def as_api_error(exc: BaseException | None) -> APIError | None:
    """The APIError inside `exc`: itself, the original a remote-call wrapper carries, or the protocol's
    error for an engine error (the edge where engine failures reach the processing: both topologies'
    model calls map through here, deployments/error_mapping.py and the HTTP layer's error bodies).

    Ray re-raises a remote exception as a wrapper that subclasses the original class but
    does not carry its attributes; the original is in `.cause`, so look there first.
    """
    for _ in range(8):
        if exc is None:
            return None
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            exc = cause
            continue
        if isinstance(exc, APIError):
            return exc
        if isinstance(exc, EngineError):
            return from_engine_error(exc)
        exc = exc.__cause__
    return None


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for any exception: APIError as-is, anything else a generic 500."""
    api = as_api_error(exc)
    if api is not None:
        return api.status, api.to_dict()
    return 500, internal_error().to_dict()
