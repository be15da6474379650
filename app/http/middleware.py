"""The Ingress's middleware of its own: the API key check (fails closed, under any route prefix) and the server span
of a traced request; and what they leave in a request's state for the handlers (the caller, its key's policy, its
trace context)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..api.errors import unauthorized
from ..generation.caller import Caller
from ..observe import tracing
from .auth import KeyChecker
from .errors import error_response
from .request_state import CALLER_STATE, POLICY_STATE, TRACE_STATE, route_path
from .routes import TABLE, ErrorShape


OPEN_PATHS = frozenset({"/health"})
"""Routes answered without a key (probes and load balancers). Everything else needs one."""
class APIKeyMiddleware:
    """Fails closed: every route but OPEN_PATHS needs a key, whatever prefix the app is mounted under.
    The caller's identity (a digest of its key) goes into the request's state for the handlers; on an
    open route a request without a valid key gets None there."""

    def __init__(self, app: Any, keys: KeyChecker, error_shape: Callable[[str], ErrorShape]) -> None:
        self.app = app
        self.keys = keys
        self.error_shape = error_shape

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            found = self.keys.identify(headers.get(b"authorization", b"").decode("latin-1"),
                                       headers.get(b"x-api-key", b"").decode("latin-1"))
            path = route_path(scope)
            if found is None and path not in OPEN_PATHS:
                await error_response(unauthorized(), self.error_shape(path), scope)(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state[CALLER_STATE] = Caller.with_key(*found) if found is not None else None
            state[POLICY_STATE] = found[1] if found is not None else None
        await self.app(scope, receive, send)


class TraceMiddleware:
    """A server span for each request to `paths` (the route table's traced ones), from its first byte in to its last byte out (a stream's
    whole life), child of the `traceparent` the client sent, if any; current while the request is handled, and
    handed to the processing in the Caller. Outside the key check, so refused requests are traced too."""

    def __init__(self, app: Any, tracer: tracing.Tracer, paths: frozenset[str] = TABLE.traced_paths) -> None:
        self.app = app
        self.tracer = tracer
        self.paths = paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = route_path(scope) if scope["type"] == "http" else None
        if path not in self.paths:
            await self.app(scope, receive, send)
            return
        parent = dict(scope.get("headers") or []).get(b"traceparent", b"").decode("latin-1") or None
        method = scope.get("method", "POST")
        span = self.tracer.start(f"{method} {path}", parent=parent, kind="server", attributes={
            "llamaray.tier": "ingress", "http.request.method": method, "http.route": path, "url.path": scope["path"]})
        scope.setdefault("state", {})[TRACE_STATE] = tracing.traceparent_of(span)

        async def send_traced(message: Any) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                if message["status"] >= 500:
                    tracing.fail(span, f"HTTP {message['status']}")
            await send(message)

        failure = None
        try:
            with tracing.active(span):
                await self.app(scope, receive, send_traced)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            tracing.end(span, failure)
