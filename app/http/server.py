"""The HTTP surface (Starlette): authenticate, validate, pick the model, hand off to the processing, frame SSE.

Kept thin on purpose: no per-token work beyond SSE framing happens here. The processing (the
ChatProcessor deployment over a Ray handle, the same code in this process, a fake in unit tests) does
prompt and reply work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route as StarletteRoute

from ..observe import tracing
from ..observe.refusals import RefusalLog, is_refusal
from .auth import KeyChecker
from .browser_guard import AllowedOriginsCORS, BrowserGuardMiddleware, BrowserPolicy, check_json_content_type
from ..api import strict_json
from ..api.errors import (
    APIError, as_api_error, error_body, forbidden, invalid_request, model_not_found, not_found, payload_too_large,
    unauthorized,
)
from .json_body import JSONBody
from .keepalive import Tick, with_ticks
from .openapi import openapi_document
from ..generation.caller import ANONYMOUS, Caller
from ..serving.health import HealthCache, health_body
from ..serving.models import READY, ModelState
from ..serving.processing import Processing
from ..serving.reply_headers import WithHeaders, split_headers
from .routes import TABLE, ErrorShape, Route, RouteTable
from ..tenants.access import may_use
from ..tenants.policies import KeyPolicy
from .sse import SSE_HEADERS, SSEDialect, frame_stream

log = logging.getLogger("llamaray.server")


@dataclass(frozen=True)
class ServerSettings:
    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 1024
    keys: KeyChecker = KeyChecker(())
    stream_keepalive_s: float = 15.0  # 0: no keep-alive comments, headers wait for the model
    browser: BrowserPolicy = BrowserPolicy()  # the Hosts and Origins answered (app/http/browser_guard.py)


# How long an accepted stream waits for the model before its headers go out: errors the model finds
# at once (prompt past the context) keep their HTTP status, a queued request is not left headerless.
HEADER_GRACE_S = 1.0


@dataclass(frozen=True)
class ModelCard:
    id: str
    owned_by: str = "llamaray"
    created: int = 0
    parent: str | None = None  # a LoRA adapter's card (`<base>:<adapter>`): its base model's id
    pool: str = ""  # the pool that loads it on demand (none: a deployment of its own)
    kind: str | None = None  # chat, embedding or rerank: which routes take it
    max_model_len: int | None = None  # its context, in tokens (vLLM's name for it)

    def allowed(self, policy: KeyPolicy | None) -> bool:
        """Whether the key's policy lets it use (and see) this model: tenants/access.py's one check."""
        if self.parent is None:
            return may_use(policy, self.id)
        return may_use(policy, self.parent, ((self.id[len(self.parent) + 1:], 1.0),))

    def to_dict(self) -> dict[str, Any]:
        card = {"id": self.id, "object": "model", "created": self.created, "owned_by": self.owned_by}
        if self.kind is not None:
            card["kind"] = self.kind
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        if self.parent is not None:  # as vLLM lists its LoRA modules
            card.update(parent=self.parent, root=self.parent)
        if self.pool:
            card["pool"] = self.pool
        return card


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


def request_id_of(scope: Any) -> str:
    """The request's id as Ray Serve and HAProxy set it (`x-request-id`, also sent back to the client)."""
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            return value.decode("latin-1")[:64]
    return ""


def tenant_of(scope: Any) -> str:
    """The name of the key the request carried (never the key), as the key middleware found it."""
    policy = scope.get("state", {}).get(POLICY_STATE)
    return policy.name if policy is not None else ""


PoolStates = Callable[[], Awaitable[dict[str, str]]]
"""Each pooled model's state (loaded, loading, available), for /v1/models."""

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


def json_answer(answer: Any) -> JSONBody:
    """A whole answer of the processing: a body, or a body with the headers it goes out with (WithHeaders)."""
    if isinstance(answer, WithHeaders):
        return JSONBody(answer.body, headers=answer.headers)
    return JSONBody(answer)


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


async def _read_json(request: Request, limit: int) -> Any:
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


def policy_of(request: Request) -> KeyPolicy | None:
    """The policy of the key the request carries (None: the server runs without keys, or an open route)."""
    return request.scope.get("state", {}).get(POLICY_STATE)


def caller_of(request: Request) -> Caller | None:
    """Who sent the request, as the key middleware found it (None: no valid key on an open route), with the
    request's trace context when it is traced."""
    state = request.scope.get("state", {})
    caller = state.get(CALLER_STATE, ANONYMOUS)
    traceparent = state.get(TRACE_STATE)
    return replace(caller, traceparent=traceparent) if caller is not None and traceparent else caller


class Endpoints:
    """The route handlers (one per `Handler` of the route table), over the processing, the models' health, their
    cards and the server's settings. Each takes the HTTP request and its line of the table."""

    def __init__(self, processing: Processing, health: HealthCache, models: list[ModelCard],
                 settings: ServerSettings, table: RouteTable, pool_states: PoolStates | None = None) -> None:
        self.processing = processing
        self.pool_states = pool_states
        self.health_cache = health
        self.cards = {m.id: m for m in models}
        self.settings = settings
        self.spec = openapi_document(table.routes)

    async def generate(self, request: Request, route: Route) -> Response:
        """A generating route: the whole body, or its stream framed by the route's framing; errors (and the error
        event that ends a stream under way) in the route's shape."""
        try:
            req = self._checked(route.read(await _read_json(request, self.settings.max_body_bytes)), request)
            caller = caller_of(request) or ANONYMOUS
            if not req.stream:
                return json_answer(await self.processing.respond(req, caller))
            framing = route.framing()
            events, first, headers = await self._open_stream(self.processing.stream(req, caller))
        except Exception as exc:  # noqa: BLE001 - each failure becomes an error body
            return error_response(exc, route.errors, request.scope)
        scope = request.scope
        return StreamingResponse(_sse(first, events, framing.dialect,
                                      lambda exc: framing.error_event(error_event(exc, route.errors, scope))),
                                 media_type="text/event-stream", headers={**SSE_HEADERS, **headers})

    async def answer(self, request: Request, route: Route) -> Response:
        """A route answered whole (embeddings, rerank, token counts, /tokenize...)."""
        try:
            req = self._checked(route.read(await _read_json(request, self.settings.max_body_bytes)), request)
            return json_answer(await self.processing.respond(req, caller_of(request) or ANONYMOUS))
        except Exception as exc:  # noqa: BLE001 - each failure becomes an error body
            return error_response(exc, route.errors, request.scope)

    async def from_path(self, request: Request, route: Route) -> Response:
        """A route whose request is its path (GET and DELETE /v1/responses/{id}: the caller's stored response)."""
        try:
            req = route.parse(request)
            return json_answer(await self.processing.respond(req, caller_of(request) or ANONYMOUS))
        except Exception as exc:  # noqa: BLE001 - each failure becomes an error body
            return error_response(exc, route.errors, request.scope)

    def admits(self, request: Request, route: Route) -> bool:
        """Whether the caller may call the route: an admin route is an admin key's (KeyPolicy.admin), or anyone's
        on a server without keys (its local user's: the browser guard keeps web pages out)."""
        if not route.admin or not self.settings.keys.enabled:
            return True
        policy = policy_of(request)
        return policy is not None and policy.admin

    async def _open_stream(self, events: AsyncIterator[Any]
                           ) -> tuple[AsyncIterator[Any], list[dict] | Tick, dict[str, str]]:
        """The stream, its first output and the headers it goes out with, pulled before answering so that
        errors found before it keep their HTTP status. The backend's first item comes once planning is done (the
        client's errors: 400), led by the key's rate-limit headers when it has limits (StreamHeaders); then the
        model's first batch is awaited for HEADER_GRACE_S at most (less with a shorter keep-alive) before the
        headers go out with a keep-alive, whatever the queue."""
        headers, first = split_headers(await anext(events))
        interval = self.settings.stream_keepalive_s
        if interval > 0:
            events = with_ticks(events, interval, first_s=min(interval, HEADER_GRACE_S))
        while not first:  # the "accepted" marker: wait for the model's first batch or a tick
            try:
                first = await anext(events)
            except StopAsyncIteration:
                break
        return events, first, headers

    def _checked(self, req: Any, request: Request) -> Any:
        """The checks that need the server, not a model: message count, model name (one the key may use: any
        other is unknown to it, as OpenAI answers), stream options."""
        messages = getattr(req, "messages", None) or []
        if len(messages) > self.settings.max_messages:
            raise invalid_request(f"Too many messages: {len(messages)} (this server accepts at most "
                                  f"{self.settings.max_messages}).", param="messages", code="too_many_messages")
        card = self.cards.get(req.model)
        if card is None or not card.allowed(policy_of(request)):
            raise model_not_found(req.model)
        if getattr(req, "stream_options", None) is not None and not req.stream:
            raise invalid_request("`stream_options` is only allowed when `stream` is true.", param="stream_options")
        return req

    async def list_models(self, request: Request, route: Route) -> Response:
        """The models the caller's key may use, each with its state."""
        states, policy = await self._pool_states(), policy_of(request)
        return JSONBody({"object": "list", "data": [_with_state(c, states) for c in self.cards.values()
                                                    if c.allowed(policy)]})

    async def get_model(self, request: Request, route: Route) -> Response:
        model_id = request.path_params["model_id"]
        card = self.cards.get(model_id)
        if card is None or not card.allowed(policy_of(request)):
            return error_response(model_not_found(model_id), scope=request.scope)
        return JSONBody(_with_state(self.cards[model_id], await self._pool_states()))

    async def _pool_states(self) -> dict[str, str]:
        if self.pool_states is None or not any(c.pool for c in self.cards.values()):
            return {}
        return await self.pool_states()

    async def health(self, request: Request, route: Route) -> Response:
        states = await self.health_cache.get()
        detailed = not self.settings.keys.enabled or caller_of(request) is not None
        status, body = health_body(states, [m for m, c in self.cards.items() if c.parent is None], detailed)
        return JSONBody(body, status_code=status)

    async def openapi(self, request: Request, route: Route) -> Response:
        return JSONBody(self.spec)


def _with_state(card: ModelCard, pool_states: dict[str, str]) -> dict[str, Any]:
    """A card, with a pooled model's state: `loaded` (a replica holds it), `loading`, or `available` (its first
    request loads it)."""
    body = card.to_dict()
    if card.pool:
        body["state"] = pool_states.get(card.id, "available")
    return body


def _all_ready(models: list[ModelCard]):
    async def states() -> dict[str, ModelState]:
        return {m.id: READY for m in models}
    return states


async def _sse(first: list[dict[str, Any]] | Tick, events: AsyncIterator[Any], dialect: SSEDialect,
               on_error: Callable[[BaseException], dict[str, Any]]) -> AsyncIterator[bytes]:
    async def batches() -> AsyncIterator[Any]:
        yield first
        async for item in events:
            yield item

    try:
        async for chunk in frame_stream(batches(), on_error, dialect):
            yield chunk
    finally:
        # Client gone: close the source now (cancels the generation, frees the slot), not at GC.
        await events.aclose()


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
                   routes: RouteTable = TABLE) -> Starlette:
    """The app over `processing`. `health`: where /health reads the models' states (None: every model is
    reported ready, for an app with no models of its own to watch). `pool_states`: each pooled model's state
    (loaded, loading, available) for /v1/models. `routes`: the route table (app/http/routes.py) it serves."""
    settings = settings or ServerSettings()
    health = health or HealthCache(_all_ready(models), [m.id for m in models])
    api = Endpoints(processing, health, models, settings, routes, pool_states)
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


OPEN_PATHS = frozenset({"/health"})
"""Routes answered without a key (probes and load balancers). Everything else needs one."""
CALLER_STATE = "llamaray.caller"
POLICY_STATE = "llamaray.key_policy"  # the key's policy (app/tenants/policies.py): its models, its limits


def route_path(scope: Any) -> str:
    """The path the app routes on: Serve keeps `route_prefix` in `path` and puts it in `root_path`."""
    path, root = scope["path"], scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path


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


TRACE_STATE = "llamaray.traceparent"


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


def model_cards(specs: list[Any]) -> list[ModelCard]:
    """A card per model, each followed by one per LoRA adapter of it (`<id>:<adapter>`, its parent the model)."""
    created = int(time.time())
    cards = []
    for s in specs:
        about = {"kind": getattr(s, "kind", None), "max_model_len": getattr(s, "n_ctx", None)}
        cards.append(ModelCard(id=s.id, owned_by=s.owned_by, created=created, pool=getattr(s, "pool", ""), **about))
        cards += [ModelCard(id=f"{s.id}:{a.name}", owned_by=s.owned_by, created=created, parent=s.id, **about)
                  for a in getattr(s, "adapters", ())]
    return cards
