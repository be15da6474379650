"""Tracing without Ray: configuration, the span helpers, the trace of a request through the HTTP app and the
processing wired as each topology wires them (the Ray hops stood in for by direct calls), and the model tier's
spans from a real engine's generation."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.testclient import TestClient

from app.observe import tracing
from app.config.app_args import Limits, TracingConfig, parse_args
from app.config.schema import ConfigError
from app.engine.jobs import DetokenizeJob, StatsJob, TokenizeJob
from app.engine.events import Finished, Started, Text
from app.engine.params import GenerationRequest, SamplingParams
from app.engine.stream import generate_stream
from app.engine.timeline import Timeline
from app.api.errors import APIError, invalid_request
from app.api.schemas import parse_chat_request
from app.http.routes import TABLE
from app.http.app import build_http_app
from app.http.middleware import TraceMiddleware
from app.http.model_cards import model_cards
from app.generation.caller import ANONYMOUS
from app.serving.processing import Processor
from app.serving.traced import HopProcessing, traced_processing
from app.serving.traced_models import TracedModels, traced_models
from tests.support.events import run_until_idle
from bench.harness.otlp_collector import OTLPCollector
from tests.support.grammars import gbnf

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
OTEL_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
            "OTEL_SERVICE_NAME")


@pytest.fixture
def no_otel_env(monkeypatch):
    for name in OTEL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spans():
    """Spans of this test, exported as they end."""
    exporter = InMemorySpanExporter()
    previous = tracing.install(tracing.make_tracer(exporter, batch=False))
    yield exporter
    tracing.install(previous).shutdown()


def hexid(n: int, width: int = 16) -> str:
    return format(n, f"0{width}x")


def by_name(finished) -> dict:
    out = {}
    for s in finished:
        assert s.name not in out, f"two spans named {s.name}"
        out[s.name] = s
    return out


def parent_of(span) -> str | None:
    return hexid(span.parent.span_id) if span.parent is not None else None


def span_id(span) -> str:
    return hexid(span.context.span_id)


def traceparent_span(traceparent: str) -> str:
    return traceparent.split("-")[2]


# ---- configuration ------------------------------------------------------------------------------------

def test_endpoint_from_args_or_the_standard_environment():
    assert tracing.resolve_endpoint(None, {}) is None
    assert tracing.resolve_endpoint("http://c:4318", {}) == "http://c:4318/v1/traces"
    assert tracing.resolve_endpoint("http://c:4318/v1/traces", {}) == "http://c:4318/v1/traces"
    assert tracing.resolve_endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318/"}) == "http://e:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}
    assert tracing.resolve_endpoint(None, env) == "http://t/x"  # the signal's own variable, as it is
    assert tracing.resolve_endpoint("http://c:4318", env) == "http://c:4318/v1/traces"  # the args win
    assert tracing.resolve_endpoint("http://c:4318", {"OTEL_SDK_DISABLED": "true"}) is None


def test_tracing_args_are_checked():
    args = {"models": [{"id": "m", "model_path": "/x.gguf"}]}
    assert parse_args(args).tracing == TracingConfig()
    parsed = parse_args({**args, "tracing": {"endpoint": "http://otel:4318", "service_name": "svc",
                                             "sample_ratio": 0.25}})
    assert parsed.tracing.endpoint == "http://otel:4318" and parsed.tracing.sample_ratio == 0.25
    with pytest.raises(ConfigError, match="tracing.endpoint"):
        parse_args({**args, "tracing": {"endpoint": "otel:4318"}})
    with pytest.raises(ConfigError, match="tracing.sample_ratio"):
        parse_args({**args, "tracing": {"sample_ratio": 1.5}})


def test_off_without_an_endpoint_and_nothing_is_wrapped(no_otel_env, bundled_spec):
    assert tracing.configure(TracingConfig()) is tracing.OFF and not tracing.current().enabled

    async def work():
        return 1

    job = work()
    assert tracing.traced("plan", job) is job  # the work itself, not a wrapper
    asyncio.run(job)
    processing, models = object(), FakeModels()
    assert traced_processing(processing, "ChatProcessor", TABLE.hop_traced) is processing
    assert traced_models(models) is models
    processor = Processor([bundled_spec], models, Limits())
    stream = processor.stream(parse_chat_request({"model": bundled_spec.id, "stream": True,
                                                  "messages": [{"role": "user", "content": "hi"}]}), ANONYMOUS)
    assert stream.ag_code.co_name == "stream"  # the chat service's own generator
    app = build_http_app(processor, model_cards([bundled_spec]))
    assert not any(m.cls is TraceMiddleware for m in app.user_middleware)


def test_configured_endpoint_receives_spans_over_otlp_http(no_otel_env):
    with OTLPCollector() as collector:
        tracer = tracing.configure(TracingConfig(endpoint=collector.url, service_name="llamaray-unit"))
        try:
            assert tracer.enabled and tracing.current() is tracer
            assert tracing.configure(TracingConfig(endpoint=collector.url)) is tracer  # once per process
            span = tracer.start("unit", parent=CLIENT_TRACEPARENT, attributes={"k": "v"})
            span.end()
            assert tracer.provider.force_flush(10_000)
        finally:
            tracing.install(tracing.OFF).shutdown()
        (got,) = collector.trace(TRACE_ID)
    assert (got.name, got.parent_id, got.attributes) == ("unit", CLIENT_SPAN, {"k": "v"})
    assert got.resource["service.name"] == "llamaray-unit"


def test_a_caller_sampling_decision_is_followed():
    exporter = InMemorySpanExporter()
    tracer = tracing.make_tracer(exporter, sample_ratio=0.0, batch=False)
    try:
        tracer.start("new trace").end()  # ratio 0: not recorded
        tracer.start("sampled by its caller", parent=CLIENT_TRACEPARENT).end()
        tracer.start("not sampled by its caller", parent=CLIENT_TRACEPARENT[:-2] + "00").end()
    finally:
        tracer.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["sampled by its caller"]


# ---- span helpers ---------------------------------------------------------------------------------------

def test_stream_in_nests_children_and_ends_with_how_it_ended(spans):
    tracer = tracing.current()

    async def items(fail: BaseException | None):
        for i in range(3):
            child = tracer.start(f"child {i}")  # started while the stream's span is current
            child.end()
            yield i
        if fail is not None:
            raise fail

    async def consume(stream, stop_after: int | None = None):
        got = []
        async for item in stream:
            got.append(item)
            if stop_after is not None and len(got) == stop_after:
                break
        await stream.aclose()
        return got

    assert asyncio.run(consume(tracing.stream_in(tracer.start("ok"), items(None)))) == [0, 1, 2]
    ok = by_name(spans.get_finished_spans())
    assert all(parent_of(ok[f"child {i}"]) == span_id(ok["ok"]) for i in range(3))
    assert ok["ok"].status.is_ok and "error.type" not in ok["ok"].attributes
    spans.clear()

    with pytest.raises(RuntimeError):
        asyncio.run(consume(tracing.stream_in(tracer.start("broken"), items(RuntimeError("boom")))))
    with pytest.raises(APIError):
        asyncio.run(consume(tracing.stream_in(tracer.start("refused"), items(invalid_request("bad")))))
    assert asyncio.run(consume(tracing.stream_in(tracer.start("left"), items(None)), stop_after=1)) == [0]
    ended = by_name(s for s in spans.get_finished_spans() if not s.name.startswith("child"))
    assert not ended["broken"].status.is_ok and ended["broken"].attributes["error.type"] == "RuntimeError"
    # the client's mistake is recorded, but is no server error
    assert ended["refused"].status.is_ok and ended["refused"].attributes["error.type"] == "invalid_request_error"
    assert ended["left"].attributes["llamaray.cancelled"] is True and ended["left"].status.is_ok


def test_traced_work_gets_attributes_from_its_result(spans):
    async def work():
        return {"n": 3}

    async def go():
        outer = tracing.current().start("outer")
        with tracing.active(outer):
            result = await tracing.traced("plan", work(), lambda r: {"llamaray.n": r["n"]})
        outer.end()
        return result

    assert asyncio.run(go()) == {"n": 3}
    got = by_name(spans.get_finished_spans())
    assert got["plan"].attributes["llamaray.n"] == 3 and parent_of(got["plan"]) == span_id(got["outer"])


# ---- a request's trace through the HTTP app and the processing, as each topology wires them -------------

class FakeModels:
    """Models whose one generation is a fixed stream; it keeps the requests it got."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def generate(self, model_id: str, request: GenerationRequest):
        self.requests.append(request)
        yield [Started(prompt_tokens=5, cached_tokens=2)]
        await asyncio.sleep(0)
        yield [Text("Hello", 1)]
        yield [Text(" there", 1), Finished("stop", prompt_tokens=5, completion_tokens=2, cached_tokens=2)]

    async def run(self, model_id, job):
        return {TokenizeJob: [1, 2], DetokenizeJob: "x", StatsJob: {}}[type(job)]

    def close(self) -> None:
        pass


MODEL_DEPLOYMENT = "LlamaModel-test"


def wired(spec, topology: str, models: FakeModels):
    """The Ingress's app over the processing as `topology` wires them (Ray handles replaced by calls)."""
    if topology == "single":
        processing = Processor([spec], traced_models(models), Limits())
    else:
        inner = Processor([spec], traced_models(models, {spec.id: MODEL_DEPLOYMENT}), Limits())
        processing = traced_processing(inner, "ChatProcessor", TABLE.hop_traced)
        assert isinstance(processing, HopProcessing) and isinstance(inner.models, TracedModels)
    return build_http_app(processing, model_cards([spec]))


@pytest.mark.parametrize("topology", ["single", "graph"])
def test_streamed_chat_is_one_trace_across_the_tiers(spans, bundled_spec, topology):
    models = FakeModels()
    body = {"model": bundled_spec.id, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with TestClient(wired(bundled_spec, topology, models)) as client:
        r = client.post("/v1/chat/completions", json=body, headers={"traceparent": CLIENT_TRACEPARENT})
    assert r.status_code == 200 and "Hello" in r.text and r.text.rstrip().endswith("[DONE]")
    got = by_name(spans.get_finished_spans())
    assert {hexid(s.context.trace_id, 32) for s in got.values()} == {TRACE_ID}

    ingress = got["POST /v1/chat/completions"]
    processing = got[f"chat {bundled_spec.id}"]
    plan = got["plan"]
    assert parent_of(ingress) == CLIENT_SPAN and ingress.kind is SpanKind.SERVER
    assert ingress.attributes["http.response.status_code"] == 200 and ingress.attributes["llamaray.tier"] == "ingress"
    (request,) = models.requests
    if topology == "graph":
        assert set(got) == {ingress.name, "ChatProcessor/stream", processing.name, plan.name,
                            f"{MODEL_DEPLOYMENT}/generate"}
        hop = got["ChatProcessor/stream"]
        model_hop = got[f"{MODEL_DEPLOYMENT}/generate"]
        assert hop.kind is SpanKind.CLIENT and parent_of(hop) == span_id(ingress)
        assert parent_of(processing) == span_id(hop)
        assert model_hop.kind is SpanKind.CLIENT and parent_of(model_hop) == span_id(processing)
        assert model_hop.attributes["rpc.service"] == MODEL_DEPLOYMENT
        assert traceparent_span(request.traceparent) == span_id(model_hop)  # the model's span joins here
    else:
        assert set(got) == {ingress.name, processing.name, plan.name}
        assert parent_of(processing) == span_id(ingress)
        assert traceparent_span(request.traceparent) == span_id(processing)
    assert parent_of(plan) == span_id(processing) and plan.attributes["llamaray.grammar"] is False
    attrs = processing.attributes
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"],
            attrs["llamaray.usage.cached_tokens"]) == (5, 2, 2)
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",) and attrs["llamaray.status"] == "ok"
    assert (attrs["llamaray.protocol"], attrs["llamaray.stream"], attrs["llamaray.tier"]) == ("chat", True, "processor")
    # the Ingress's span lasts as long as the stream it sends
    assert ingress.start_time <= processing.start_time and ingress.end_time >= processing.end_time


def test_only_generations_get_hop_spans(spans, bundled_spec):
    """A lookup (/tokenize) crosses the Ray hop untraced, inside the Ingress's span; a count that plans a turn
    (/v1/responses/input_tokens) gets its hop span, as the route table says."""
    with TestClient(wired(bundled_spec, "graph", FakeModels())) as client:
        tokens = client.post("/tokenize", json={"model": bundled_spec.id, "prompt": "Hi"})
        assert tokens.status_code == 200 and tokens.json()["count"] == 2
        assert set(by_name(spans.get_finished_spans())) == {"POST /tokenize"}
        spans.clear()
        counted = client.post("/v1/responses/input_tokens", json={"model": bundled_spec.id, "input": "Hi"})
        assert counted.status_code == 200
    got = by_name(spans.get_finished_spans())
    assert parent_of(got["ChatProcessor/respond"]) == span_id(got["POST /v1/responses/input_tokens"])


def test_completions_and_refusals_are_traced(spans, bundled_spec):
    models = FakeModels()
    with TestClient(wired(bundled_spec, "single", models)) as client:
        ok = client.post("/v1/completions", json={"model": bundled_spec.id, "prompt": "Hi", "max_tokens": 4})
        bad = client.post("/v1/completions", json={"model": bundled_spec.id, "prompt": "Hi", "max_tokens": -1})
        client.get("/v1/models")
    assert ok.status_code == 200 and bad.status_code == 400
    finished = spans.get_finished_spans()
    ingress = [s for s in finished if s.name == "POST /v1/completions"]
    assert sorted(s.attributes["http.response.status_code"] for s in ingress) == [200, 400]
    assert all(s.status.is_ok for s in ingress)  # a 400 is the client's error, not the server's
    (processing,) = [s for s in finished if s.name == f"text_completion {bundled_spec.id}"]
    assert processing.attributes["llamaray.protocol"] == "completions"
    assert processing.attributes["gen_ai.usage.output_tokens"] == 2
    assert not any(s.name.startswith("GET") for s in finished)  # only the generating and tokenizer routes


# ---- the model tier, from a real generation ------------------------------------------------------------

def test_model_spans_follow_the_generation(spans, engine):
    parent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    # letters only, more than 6 tokens can spell: the reply is cut at max_tokens
    sampling = SamplingParams(seed=3, grammar=gbnf("root ::= [a-z ]{100,120}"))
    request = GenerationRequest(request_id="r1", prompt="Once upon a time", max_tokens=6, sampling=sampling,
                                traceparent=parent)

    async def go():
        timeline, events = Timeline(), []
        async for batch in generate_stream(engine, request, 0.0):
            timeline.feed(batch)
            events.extend(batch)
        timeline.close()
        tracing.record_generation(timeline, request, "smollm2-135m")
        return events

    events = run_until_idle(engine, go())
    started = next(e for e in events if isinstance(e, Started))
    finished = next(e for e in events if isinstance(e, Finished))
    got = by_name(spans.get_finished_spans())
    generate = got["generate smollm2-135m"]
    assert parent_of(generate) == CLIENT_SPAN and generate.kind is SpanKind.SERVER
    attrs = generate.attributes
    assert attrs["gen_ai.usage.input_tokens"] == started.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == finished.completion_tokens == 6
    assert attrs["gen_ai.response.finish_reasons"] == ("length",) and attrs["llamaray.request_id"] == "r1"
    queue, prefill, decode = got["queue"], got["prefill"], got["decode"]
    assert all(parent_of(s) == span_id(generate) for s in (queue, prefill, decode))
    # in order, within the generation
    assert generate.start_time <= queue.start_time <= queue.end_time == prefill.start_time
    assert prefill.end_time == decode.start_time <= decode.end_time <= generate.end_time
    assert prefill.end_time > prefill.start_time and decode.end_time > decode.start_time
    (event,) = generate.events
    assert event.name == "first_token" and event.timestamp == prefill.end_time


def test_a_cancelled_generation_ends_its_span_as_cancelled(spans):
    timeline = Timeline()
    timeline.feed([Started(prompt_tokens=4, cached_tokens=0)])
    timeline.feed([Text("a", 1)])
    timeline.close(GeneratorExit())
    tracing.record_generation(timeline, GenerationRequest(request_id="r", prompt="p"), "m", GeneratorExit())
    got = by_name(spans.get_finished_spans())
    assert got["generate m"].attributes["llamaray.cancelled"] is True
    assert got["generate m"].attributes["gen_ai.response.finish_reasons"] == ("abort",)
    assert parent_of(got["generate m"]) is None  # no traceparent: a trace of its own
