"""The HTTP app (Starlette) made from the route table: one route per path (a method it lacks: 405 with `Allow`), the
handlers of endpoints.py, the errors' shapes per protocol, and the middleware in order: traces, the browser guard
(Host, Origin), CORS for allowed origins, the API keys.

Kept thin on purpose: no per-token work beyond SSE framing happens in the Ingress. The processing (the
ChatProcessor deployment over a Ray handle, the same code in this process, a fake in unit tests) does
prompt and reply work."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as StarletteRoute

from ..api.errors import APIError, forbidden, not_found
from ..observe import tracing
from ..serving.health import HealthCache
from ..serving.processing import Processing
from .batch_routes import BatchEdge
from .browser_guard import AllowedOriginsCORS, BrowserGuardMiddleware
from .endpoints import Endpoints, ServerSettings, all_ready
from .errors import error_response
from .middleware import APIKeyMiddleware, TraceMiddleware
from .request_state import route_path
from .metrics_page import NodeMetrics
from .model_cards import ModelCard, PoolStates
from .routes import TABLE, Route, RouteTable


def _http_error(table: RouteTable) -> Callable[[Request, HTTPException], Awaitable[Response]]:
    async def handle(request: Request, exc: HTTPException) -> Response:
        shape = table.error_shape(route_path(request.scope))
        if exc.status_code == 404:
            return error_response(not_found(f"Unknown path: {request.method} {request.url.path}"), shape,
                                  request.scope)
        if exc.status_code == 405:
            return error_response(APIError(f"Method {request.method} is not allowed on {request.url.path}.",
                                           status=405, type="invalid_request_error", code="method_not_allowed",
                                           headers=dict(exc.headers or {})), shape, request.scope)
        return error_response(APIError(str(exc.detail), status=exc.status_code, type="invalid_request_error"), shape,
                              request.scope)
    return handle


def _refusal(table: RouteTable) -> Callable[[APIError, Any], Response]:
    return lambda error, scope: error_response(error, table.error_shape(route_path(scope)), scope)


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(exc, scope=request.scope)


def _endpoint(api: Endpoints, lines: dict[str, Route]) -> Callable[[Request], Awaitable[Response]]:
    """One path's endpoint: the handler its table line names for the request's method (HEAD: GET's)."""
    async def endpoint(request: Request) -> Response:
        route = lines["GET" if request.method == "HEAD" else request.method]
        if not api.admits(request, route):
            return error_response(forbidden(f"{route.method} {route.path} is an admin route: the API key used has no "
                                            "`admin: true` in the keys file."), route.errors, request.scope)
        return await getattr(api, route.handler.value)(request, route)
    return endpoint


def build_http_app(processing: Processing, models: list[ModelCard], settings: ServerSettings | None = None,
                   health: HealthCache | None = None, pool_states: PoolStates | None = None,
                   routes: RouteTable = TABLE, node_metrics: NodeMetrics | None = None,
                   batches: BatchEdge | None = None) -> Starlette:
    """The app over `processing`. `health`: where /health reads the models' states (None: every model is
    reported ready, for an app with no models of its own to watch). `pool_states`: each pooled model's state
    (loaded, loading, available) for /v1/models. `routes`: the route table (app/http/routes.py) it serves.
    `node_metrics`: where /metrics reads the node's metrics (None: a 404). `batches`: the batch routes' byte
    streams over the batch store (None: batch jobs are off)."""
    settings = settings or ServerSettings()
    health = health or HealthCache(all_ready(models), [m.id for m in models])
    api = Endpoints(processing, health, models, settings, routes, pool_states, node_metrics, batches)
    # One Starlette route per path, so that a method it lacks gets 405 with every method it has in `Allow`.
    starlette_routes = [StarletteRoute(path, _endpoint(api, lines), methods=list(lines))
                        for path, lines in routes.by_path.items()]
    middleware = ([Middleware(TraceMiddleware, tracer=tracing.current(), paths=routes.traced_paths)]
                  if tracing.current().enabled else [])
    # Host and Origin first, then CORS for allowed origins (a preflight carries no key), then the key.
    middleware += [Middleware(BrowserGuardMiddleware, policy=settings.browser, refuse=_refusal(routes)),
                   Middleware(AllowedOriginsCORS, policy=settings.browser)]
    if settings.keys.enabled:
        middleware.append(Middleware(APIKeyMiddleware, keys=settings.keys, error_shape=routes.error_shape))
    return Starlette(
        routes=starlette_routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error(routes), Exception: _server_error},
    )
