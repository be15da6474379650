"""OpenTelemetry spans along a request's path, in either topology:

    POST /v1/chat/completions               the HTTP request at the Ingress, to its last byte (server.py)
      ChatProcessor/stream                  the Ray hop to the processing (topology graph; serving/traced.py)
        chat <model>                        the processing: usage, status, finish reason (serving/processing.py)
          plan                              chat template and grammar (chat/service.py, completions/service.py)
          LlamaModel-<model>/generate       the Ray hop to the model (topology graph)
            generate <model>                the model replica: prompt, cached and generated tokens, finish reasons
              queue, prefill, decode        submitted -> admitted to a slot -> first token -> end

W3C trace context crosses each Ray hop inside the values that cross it anyway (Caller.traceparent,
GenerationRequest.traceparent); within a process spans nest through OpenTelemetry's current context.

Off unless an OTLP endpoint is configured (app args `tracing.endpoint`, or the standard
$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / $OTEL_EXPORTER_OTLP_ENDPOINT in the replicas' environment): then
`current().enabled` is False, every call site checks that flag and does nothing more, and OpenTelemetry is
never imported. Spans go out over OTLP/HTTP (protobuf) in batches, from a background thread.

Ray Serve's own tracing (`tracing_config`) is set per Serve instance, with an exporter named by import path,
and follows handle calls only; this one comes with the app's args, covers the one-replica topology too, and
keeps its own tracer provider (Ray's global one is left alone), so the two can run together.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..api.errors import as_api_error

if TYPE_CHECKING:
    from ..config.app_args import TracingConfig
    from ..engine.params import GenerationRequest
    from ..engine.timeline import Timeline
    from .request_records import RequestObserver, RequestRecord

T = TypeVar("T")

DEFAULT_SERVICE = "llamaray"
TRACES_PATH = "/v1/traces"
SCOPE = "llamaray"


def resolve_endpoint(configured: str | None, env: Any = os.environ) -> str | None:
    """Where spans go: `configured` (its /v1/traces), else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else
    $OTEL_EXPORTER_OTLP_ENDPOINT's /v1/traces. None: tracing is off (also with $OTEL_SDK_DISABLED=true)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if configured:
        return _traces_url(configured)
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return _traces_url(base) if base else None


def _traces_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


class Tracer:
    """This process's spans, or none: with no provider `enabled` is False and nothing else may be called."""

    def __init__(self, provider: Any = None, endpoint: str | None = None) -> None:
        self.provider = provider
        self.endpoint = endpoint
        self.enabled = provider is not None
        self._tracer = provider.get_tracer(SCOPE) if provider is not None else None

    def start(self, name: str, *, parent: Any = None, kind: str = "internal",
              attributes: dict[str, Any] | None = None, start_ns: int | None = None) -> Any:
        """A started span. `parent`: a traceparent string, a span, or None for the current context."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        if isinstance(parent, str):
            ctx = context_of(parent)
        elif parent is not None:
            ctx = trace.set_span_in_context(parent)
        else:
            ctx = None
        return self._tracer.start_span(name, context=ctx, kind=getattr(SpanKind, kind.upper()),
                                       attributes=attributes, start_time=start_ns)

    def shutdown(self) -> None:
        """Export what is still buffered and stop."""
        if self.provider is not None:
            self.provider.shutdown()


OFF = Tracer()
_current = OFF


def current() -> Tracer:
    return _current


def install(tracer: Tracer) -> Tracer:
    """Make `tracer` this process's; returns the one it replaces."""
    global _current
    previous, _current = _current, tracer
    return previous


def configure(config: TracingConfig | None) -> Tracer:
    """Set up this process's tracing as the app's `tracing` args (and the environment) say, once: each replica
    calls it as it starts, and replicas sharing a process share the tracer. Nothing configured: off."""
    endpoint = resolve_endpoint(config.endpoint if config is not None else None)
    if endpoint is None or (_current.enabled and _current.endpoint == endpoint):
        return _current
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    install(make_tracer(OTLPSpanExporter(endpoint=endpoint), service_name=config.service_name if config else None,
                        sample_ratio=config.sample_ratio if config else 1.0, endpoint=endpoint))
    return _current


def make_tracer(exporter: Any, *, service_name: str | None = None, sample_ratio: float = 1.0, batch: bool = True,
                endpoint: str | None = None) -> Tracer:
    """A tracer exporting to `exporter` (an OpenTelemetry SpanExporter). New traces are sampled at
    `sample_ratio`; a span whose parent came with a trace context follows the parent's decision."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
    resource = Resource.create({"service.name": name, "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return Tracer(provider, endpoint)


# -- trace context ------------------------------------------------------------------------------------
_PROPAGATOR: Any = None


def _propagator() -> Any:
    global _PROPAGATOR
    if _PROPAGATOR is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _PROPAGATOR = TraceContextTextMapPropagator()
    return _PROPAGATOR


def context_of(traceparent: str) -> Any:
    """The OpenTelemetry context a W3C `traceparent` value names (an empty one if it is malformed)."""
    return _propagator().extract({"traceparent": traceparent})


def traceparent_of(span: Any | None = None) -> str | None:
    """`span`'s W3C traceparent (None: the current span's); None when there is no valid span."""
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    ctx = trace.set_span_in_context(span) if span is not None else None
    _propagator().inject(carrier, context=ctx)
    return carrier.get("traceparent")


# -- spans around work --------------------------------------------------------------------------------
def end(span: Any, failure: BaseException | None = None, end_ns: int | None = None) -> None:
    """Ends `span`, saying how its work ended: cancelled (the caller left), or failed: `error.type` is the
    API error's code, and the status is an error for a server-side failure (5xx or unexpected), not for a
    request the client got wrong."""
    if failure is not None and span.is_recording():
        if isinstance(failure, (asyncio.CancelledError, GeneratorExit)):
            span.set_attribute("llamaray.cancelled", True)
        else:
            api = as_api_error(failure)
            span.set_attribute("error.type", (api.code or api.type) if api is not None else type(failure).__name__)
            if api is None or api.status >= 500:
                fail(span, api.message if api is not None else type(failure).__name__)
    span.end(end_time=end_ns)


def fail(span: Any, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


def active(span: Any) -> Any:
    """Context manager: `span` is the current span within it (child spans and traceparents start from it)."""
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


async def awaited_in(span: Any, work: Awaitable[T]) -> T:
    """`work`, awaited with `span` current; the span ends with it."""
    failure = None
    try:
        with active(span):
            return await work
    except BaseException as exc:
        failure = exc
        raise
    finally:
        end(span, failure)


async def stream_in(span: Any, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """`items`, each pulled with `span` current (never across a `yield`, where the consumer's code runs);
    the span ends when the stream does, however it does."""
    failure = None
    try:
        while True:
            with active(span):
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    break
            yield item
    except BaseException as exc:
        failure = exc
        raise
    finally:
        try:
            with active(span):
                await items.aclose()
        finally:
            end(span, failure)


def traced(name: str, work: Awaitable[T], describe: Callable[[T], dict[str, Any]] | None = None) -> Awaitable[T]:
    """`work` under a span `name`, child of the current span, with the attributes `describe` reads from its
    result; `work` itself when tracing is off."""
    return _traced(_current, name, work, describe) if _current.enabled else work


async def _traced(tracer: Tracer, name: str, work: Awaitable[T], describe: Callable[[T], dict[str, Any]] | None) -> T:
    span = tracer.start(name)
    failure = None
    try:
        with active(span):
            result = await work
        if describe is not None and span.is_recording():
            span.set_attributes(describe(result))
        return result
    except BaseException as exc:
        failure = exc
        raise
    finally:
        end(span, failure)


# -- what the spans say -------------------------------------------------------------------------------
def record_attributes(rec: RequestRecord) -> dict[str, Any]:
    """A processed request's outcome, as attributes of its span (OpenTelemetry's gen_ai.* names where
    they exist)."""
    out: dict[str, Any] = {
        "llamaray.status": rec.status,
        "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.completion_tokens,
        "llamaray.usage.cached_tokens": rec.cached_tokens,
    }
    if rec.finish_reason:
        out["gen_ai.response.finish_reasons"] = [rec.finish_reason]
    if rec.adapter:
        out["llamaray.adapter"] = rec.adapter
    if rec.error_code:
        out["error.type"] = rec.error_code
    if rec.ttft_s is not None:
        out["llamaray.time_to_first_token_s"] = rec.ttft_s
    return out


class RecordsOnSpans:
    """A RequestObserver that also writes each record onto the current span: the processing records a
    request while its span is current (serving/processing.py)."""

    def __init__(self, inner: RequestObserver) -> None:
        self.inner = inner

    def record(self, rec: RequestRecord) -> None:
        self.inner.record(rec)
        from opentelemetry import trace

        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(record_attributes(rec))


def record_generation(timeline: Timeline, request: GenerationRequest, model: str,
                      failure: BaseException | None = None) -> None:
    """The model tier's spans for one generation, made once it is over from its timeline: `generate <model>`
    (a child of the request's traceparent) with `queue` (submitted -> admitted to a slot), `prefill`
    (admitted -> first token) and `decode` (first token -> end) under it, and a `first_token` event."""
    tracer = _current
    if not tracer.enabled:
        return
    attrs: dict[str, Any] = {"llamaray.tier": "model", "gen_ai.operation.name": "generate",
                             "gen_ai.request.model": model, "llamaray.request_id": request.request_id,
                             "gen_ai.request.choice.count": request.n}
    if request.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = request.max_tokens
    adapter = ",".join(name for name, scale in request.adapters if scale != 0)
    if adapter:
        attrs["llamaray.adapter"] = adapter
    span = tracer.start(f"generate {model}", parent=request.traceparent, kind="server", attributes=attrs,
                        start_ns=timeline.ns(timeline.arrived))
    choices = [c for c in timeline.choices.values() if c.admitted_at is not None]
    if span.is_recording() and choices:
        first = choices[0]
        span.set_attributes({
            "gen_ai.usage.input_tokens": first.prompt_tokens,
            "llamaray.usage.cached_tokens": first.cached_tokens,
            "llamaray.kv_from": first.cached_from or "none",
            "gen_ai.usage.output_tokens": sum(c.tokens for c in choices),
            "gen_ai.response.finish_reasons": [c.finish_reason or "" for c in choices],
            "llamaray.queue_s": first.queued_s,
        })
        admitted = min(c.admitted_at for c in choices)
        ended = max(c.ended_at if c.ended_at is not None else admitted for c in choices)
        _child(tracer, span, "queue", timeline.ns(admitted - first.queued_s), timeline.ns(admitted))
        tokens_at = [c.first_token_at for c in choices if c.first_token_at is not None]
        if tokens_at:
            first_token = min(tokens_at)
            span.add_event("first_token", {"llamaray.time_to_first_token_s": first_token - timeline.arrived},
                           timestamp=timeline.ns(first_token))
            _child(tracer, span, "prefill", timeline.ns(admitted), timeline.ns(first_token))
            _child(tracer, span, "decode", timeline.ns(first_token), timeline.ns(ended))
        else:
            _child(tracer, span, "prefill", timeline.ns(admitted), timeline.ns(ended))
    ended_at = timeline.ended if timeline.ended is not None else timeline.arrived
    end(span, failure, end_ns=timeline.ns(ended_at))


def _child(tracer: Tracer, parent: Any, name: str, start_ns: int, end_ns: int) -> None:
    tracer.start(name, parent=parent, attributes={"llamaray.tier": "model"}, start_ns=start_ns).end(end_time=end_ns)
