"""The Ingress's errors: each failure as the protocol's error body with its status and headers, and in the log
once: a refusal the server chose as one INFO line (app/observe/refusals.py), an unexpected failure with its
traceback, any other 5xx as one WARNING line."""

from __future__ import annotations

import logging
from typing import Any

from ..api.errors import as_api_error, error_body
from ..observe.refusals import RefusalLog, is_refusal
from .json_body import JSONBody
from .request_state import request_id_of, route_path, tenant_of
from .routes import ErrorShape

log = logging.getLogger("llamaray.server")


REFUSALS = RefusalLog()
"""This process's refusals, one INFO line each (rate-limited per key and kind: app/observe/refusals.py)."""


def log_error(exc: BaseException, scope: Any = None) -> None:
    """Every error the server answers with, in its log once: a refusal it chose (a 4xx, a busy 503) as one INFO
    line with the request id and key name (REFUSALS); an unexpected exception with its traceback; another APIError
    (a condition: a timeout, a replica gone) as one WARNING line, unless it was logged where it was made."""
    api = as_api_error(exc)
    if api is None:
        log.error("unhandled error: %r", exc, exc_info=exc)
    elif is_refusal(api):
        if scope is not None and not api.logged:
            REFUSALS.refused(api, request_id=request_id_of(scope), tenant=tenant_of(scope), route=route_path(scope))
            api.logged = True
    elif api.status >= 500 and not api.logged:
        log.warning("%d %s: %s", api.status, api.code, api.message)
        api.logged = True


def error_response(exc: BaseException, shape: ErrorShape = error_body, scope: Any = None) -> JSONBody:
    """The error's body in the protocol's `shape`, with its status and headers; logged (`scope`: the request's,
    which says who was refused)."""
    status, body = shape(exc)
    log_error(exc, scope)
    api = as_api_error(exc)
    return JSONBody(body, status_code=status, headers=api.headers if api else None)


def error_event(exc: BaseException, shape: ErrorShape = error_body, scope: Any = None) -> dict[str, Any]:
    """The error event that ends a stream already under way."""
    log_error(exc, scope)
    return shape(exc)[1]
