"""The route handlers (one per `Handler` of the route table), over the processing, the models' health, their cards
and the server's settings: read and check the request, hand it to the processing, answer its body or frame its
stream; the server's own answers (models, health, its OpenAPI document)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..api.errors import invalid_request, model_not_found, not_found, service_unavailable
from ..generation.caller import ANONYMOUS
from ..serving.health import HealthCache, health_body
from ..serving.models import READY, ModelState
from ..serving.processing import Processing
from ..serving.reply_headers import WithHeaders, split_headers
from ..tenants.prep_pool import PREPARATION
from .auth import KeyChecker
from .batch_routes import BatchEdge
from .browser_guard import BrowserPolicy
from .errors import error_event, error_response
from .json_body import JSONBody
from .keepalive import Tick, with_ticks
from .metrics_page import PROMETHEUS_TEXT, NodeMetrics, metrics_text
from .request_state import caller_of, policy_of
from .model_cards import ModelCard, PoolStates
from .openapi import openapi_document
from .request_body import read_json
from .routes import Route, RouteTable
from .sse import SSE_HEADERS, SSEDialect, frame_stream


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


def json_answer(answer: Any) -> JSONBody:
    """A whole answer of the processing: a body, or a body with the headers it goes out with (WithHeaders)."""
    if isinstance(answer, WithHeaders):
        return JSONBody(answer.body, headers=answer.headers)
    return JSONBody(answer)


class Endpoints:
    """The route handlers (one per `Handler` of the route table), over the processing, the models' health, their
    cards and the server's settings. Each takes the HTTP request and its line of the table."""

    def __init__(self, processing: Processing, health: HealthCache, models: list[ModelCard],
                 settings: ServerSettings, table: RouteTable, pool_states: PoolStates | None = None,
                 node_metrics: NodeMetrics | None = None, batches: BatchEdge | None = None) -> None:
        self.processing = processing
        self.batches = batches
        self.pool_states = pool_states
        self.node_metrics = node_metrics
        self.health_cache = health
        self.cards = {m.id: m for m in models}
        self.settings = settings
        self.spec = openapi_document(table.routes)

    async def generate(self, request: Request, route: Route) -> Response:
        """A generating route: the whole body, or its stream framed by the route's framing; errors (and the error
        event that ends a stream under way) in the route's shape."""
        try:
            req = self._checked(route.read(await read_json(request, self.settings.max_body_bytes)), request, route)
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
                                 media_type=framing.dialect.media_type, headers={**SSE_HEADERS, **headers})

    async def answer(self, request: Request, route: Route) -> Response:
        """A route answered whole (embeddings, rerank, token counts, /tokenize...)."""
        try:
            req = self._checked(route.read(await read_json(request, self.settings.max_body_bytes)), request, route)
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

    # -- the batch routes' byte streams (app/http/batch_routes.py) ------------------------------------------------
    def _batch_edge(self) -> BatchEdge:
        if self.batches is None:
            raise not_found("Batch jobs are off on this server (batch.enabled: false).")
        return self.batches

    async def upload_file(self, request: Request, route: Route) -> Response:
        """`POST /v1/files`: a multipart upload streamed to the batch store."""
        async def upload(edge: BatchEdge, caller: Any) -> Response:
            return JSONBody((await edge.upload(request, caller)).to_openai())
        return await self._on_batch_edge(request, route, upload)

    async def file_content(self, request: Request, route: Route) -> Response:
        return await self._on_batch_edge(request, route, lambda edge, caller: edge.content(request, caller))

    async def create_message_batch(self, request: Request, route: Route) -> Response:
        async def create(edge: BatchEdge, caller: Any) -> Response:
            return json_answer(await edge.create_message_batch(request, caller, self.processing.respond))
        return await self._on_batch_edge(request, route, create)

    async def message_batch_results(self, request: Request, route: Route) -> Response:
        return await self._on_batch_edge(request, route,
                                         lambda edge, caller: edge.message_batch_results(request, caller))

    async def _on_batch_edge(self, request: Request, route: Route,
                             call: Callable[[BatchEdge, Any], Awaitable[Response]]) -> Response:
        """A byte-streaming batch route's answer from the batch store's edge, each failure in the route's error
        shape (batch jobs off: its refusal too)."""
        try:
            return await call(self._batch_edge(), caller_of(request) or ANONYMOUS)
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

    def _checked(self, req: Any, request: Request, route: Route) -> Any:
        """The checks that need the server, not a model: message count, model name (one the key may use: any
        other is unknown to it, as OpenAI answers; resolved first where the route's protocol names models its own
        way), stream options. The request, its model named as configured."""
        messages = getattr(req, "messages", None) or []
        if len(messages) > self.settings.max_messages:
            raise invalid_request(f"Too many messages: {len(messages)} (this server accepts at most "
                                  f"{self.settings.max_messages}).", param="messages", code="too_many_messages")
        policy = policy_of(request)

        def known(model_id: str) -> bool:
            card = self.cards.get(model_id)
            return card is not None and card.allowed(policy)

        names_model = hasattr(req, "model")  # a batch's creation names none: its lines do (app/batches/validation.py)
        if route.resolve is not None:
            req = route.resolve(req, known)
        elif names_model and req.model is None:  # a route that may leave it out (/infill, as editors call llama-server)
            req = req.model_copy(update={"model": self._only_chat_model(request)})
        if names_model and not known(req.model):
            raise model_not_found(req.model)
        if getattr(req, "stream_options", None) is not None and not req.stream:
            raise invalid_request("`stream_options` is only allowed when `stream` is true.", param="stream_options")
        return req

    def _only_chat_model(self, request: Request) -> str:
        """The one chat model the caller's key may use, for a request that names none; a 400 when it may use
        several (or none)."""
        policy = policy_of(request)
        usable = [c.id for c in self.cards.values() if c.kind == "chat" and c.parent is None and c.allowed(policy)]
        if len(usable) != 1:
            raise invalid_request(f"`model` is required: this server has {len(usable)} chat models for this key "
                                  f"({', '.join(usable[:8])}{', ...' if len(usable) > 8 else ''}).", param="model",
                                  code="missing_required_parameter")
        return usable[0]

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

    async def metrics(self, request: Request, route: Route) -> Response:
        """The node's metrics of this application that the caller's key may see (app/http/metrics_page.py)."""
        source = self.node_metrics
        if source is None:
            return error_response(not_found("This server has no node metrics to serve here (it does not run on "
                                            "Ray)."), route.errors, request.scope)
        try:
            export = await source.read()
        except Exception as exc:  # noqa: BLE001 - the node's agent down or slow: the scrape fails, said so
            error = service_unavailable(f"The node's metrics could not be read from Ray's metrics agent: "
                                        f"{type(exc).__name__}: {str(exc)[:200]}", code="metrics_unavailable")
            return error_response(error, route.errors, request.scope)
        caller = caller_of(request) or ANONYMOUS
        # A node's export can be megabytes: read off the event loop, in the key's turn, as any request's CPU work.
        text = await PREPARATION.run(caller.tenant, metrics_text, export, source.application, policy_of(request),
                                     self.cards)
        return Response(text, media_type=PROMETHEUS_TEXT)


def _with_state(card: ModelCard, pool_states: dict[str, str]) -> dict[str, Any]:
    """A card, with a pooled model's state: `loaded` (a replica holds it), `loading`, or `available` (its first
    request loads it)."""
    body = card.to_dict()
    if card.pool:
        body["state"] = pool_states.get(card.id, "available")
    return body


def all_ready(models: list[ModelCard]):
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
