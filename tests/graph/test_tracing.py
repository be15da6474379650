"""Traces and vLLM-named metrics through a real Ray Serve, each topology on a cluster of its own whose replicas
export spans to an OTLP/HTTP collector in this test process (app args `tracing.endpoint`).

One streamed chat request, sent with the client's own W3C `traceparent`, is one trace: the HTTP request at the
Ingress, the processing and its planning, the generation in the model with its queue wait, prefill and decode,
and with topology `graph` a client span for each Ray hop, each tier's spans coming from its own process."""

from __future__ import annotations

import re
import secrets
import time

import httpx
import pytest

from app.config.spec import deployment_name
from bench.harness.otlp_collector import CLIENT, SERVER, OTLPCollector
from tests.support.prometheus import series, total
from tests.support.serve_harness import APP, MODEL, ServeCluster, free_port, load_config, sse_json

pytestmark = pytest.mark.timeout(600)
MODEL_DEPLOYMENT = deployment_name(MODEL)
SERVICE = "llamaray-trace-test"
# Letters only, more than 8 tokens can spell: the reply is cut at max_tokens.
GRAMMAR = "root ::= [a-z ]{200,220}"


# The single topology's run is in make test-slow: a cluster of its own costs ~15 s to start, and a trace across
# the tiers is the graph's question (make test asks it there).
@pytest.fixture(scope="module", params=[pytest.param("single", marks=pytest.mark.slow), "graph"])
def traced(request):
    """(topology, cluster, collector): each topology starts a cluster of its own (stopping any shared one)."""
    topology = request.param
    overlays: list = ["configs/local-cpu.yaml"] + (["configs/local-graph.yaml"] if topology == "graph" else [])
    with OTLPCollector() as collector:
        config = load_config(*overlays, {"applications": [{"name": APP, "args": {
            "models": [{"id": MODEL, "n_ctx": 1024, "speculative": {"adaptive": False}}],
            "tracing": {"endpoint": collector.url, "service_name": SERVICE}}}]})
        # The replicas inherit this environment: their span batches leave every 0.2 s instead of 5 s; a
        # host name this keyless server answers besides loopback ones (test_a_keyless_server_...).
        with ServeCluster(config, num_cpus=2, serve_local=topology == "single", metrics_port=free_port(),
                          env={"OTEL_BSP_SCHEDULE_DELAY": "200", "LLAMARAY_ALLOWED_HOSTS": "llm.test"}) as cluster:
            yield topology, cluster, collector


def expected_spans(topology: str) -> set[str]:
    names = {"POST /v1/chat/completions", f"chat {MODEL}", "plan", f"generate {MODEL}", "queue", "prefill", "decode"}
    if topology == "graph":
        names |= {"ChatProcessor/stream", f"{MODEL_DEPLOYMENT}/generate"}
    return names


def test_a_streamed_request_is_one_trace_across_the_tiers(traced):
    topology, cluster, collector = traced
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8,
            "seed": 1, "grammar": GRAMMAR, "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=120,
                   headers={**cluster.headers, "traceparent": f"00-{trace_id}-{client_span}-01"})
    assert r.status_code == 200, r.text
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]"
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 8

    wanted = expected_spans(topology)
    spans = collector.wait_for(trace_id, lambda got: wanted <= {s.name for s in got}, timeout_s=90)
    names = sorted(s.name for s in spans)
    assert wanted <= set(names), f"spans received for the trace: {names}"
    assert len(names) == len(set(names)) == len(wanted), names  # one of each, nothing else
    span = {s.name: s for s in spans}
    assert all(s.resource["service.name"] == SERVICE for s in spans)

    def parent(name: str) -> str:
        return span[name].parent_id

    ingress, processing, generate = (span["POST /v1/chat/completions"], span[f"chat {MODEL}"],
                                     span[f"generate {MODEL}"])
    assert ingress.parent_id == client_span and ingress.kind == SERVER
    assert ingress.attributes["http.response.status_code"] == 200
    if topology == "graph":
        hop, model_hop = span["ChatProcessor/stream"], span[f"{MODEL_DEPLOYMENT}/generate"]
        assert hop.kind == CLIENT and hop.parent_id == ingress.span_id and processing.parent_id == hop.span_id
        assert model_hop.kind == CLIENT and model_hop.parent_id == processing.span_id
        assert generate.parent_id == model_hop.span_id
        # each tier in its own replica process
        pids = {s.attributes["llamaray.tier"]: s.resource["process.pid"] for s in (ingress, processing, generate)}
        assert len(set(pids.values())) == 3, pids
        assert hop.resource["process.pid"] == pids["ingress"] and model_hop.resource["process.pid"] == pids["processor"]
    else:
        assert processing.parent_id == ingress.span_id and generate.parent_id == processing.span_id
        assert len({s.resource["process.pid"] for s in spans}) == 1  # one replica does it all
    assert parent("plan") == processing.span_id and span["plan"].attributes["llamaray.grammar"] is True
    assert {parent("queue"), parent("prefill"), parent("decode")} == {generate.span_id}

    # what each tier says about the request
    assert processing.attributes["gen_ai.request.model"] == MODEL
    assert processing.attributes["llamaray.protocol"] == "chat" and processing.attributes["llamaray.stream"] is True
    for s in (processing, generate):
        assert s.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"], s.name
        assert s.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"], s.name
        assert s.attributes["llamaray.usage.cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"], s.name
        assert s.attributes["gen_ai.response.finish_reasons"] == ["length"], s.name
    assert generate.attributes["gen_ai.request.choice.count"] == 1
    assert "first_token" in generate.events
    # nested in time: the Ingress's span lasts the whole stream; the model's phases follow each other
    assert ingress.start_ns <= processing.start_ns <= generate.start_ns <= span["queue"].start_ns
    assert span["queue"].end_ns == span["prefill"].start_ns and span["prefill"].end_ns == span["decode"].start_ns
    assert span["decode"].end_ns <= generate.end_ns <= processing.end_ns <= ingress.end_ns
    assert not any(s.error for s in spans)


def test_model_metrics_under_vllm_names(traced):
    """The model replica's metrics under vLLM's names and labels (what Ray Serve LLM's dashboard and TTFT
    autoscaling read), next to llamaray's own request counter with its `protocol` label."""
    topology, cluster, _ = traced
    r = httpx.post(f"{cluster.url}/v1/completions", headers=cluster.headers, timeout=120,
                   json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "grammar": GRAMMAR})
    assert r.status_code == 200, r.text
    # A reply that copies its prompt: prompt-lookup drafts verified (the model's `speculative`, every proposal).
    r = httpx.post(f"{cluster.url}/v1/completions", headers=cluster.headers, timeout=120,
                   json={"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2,",
                         "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    url = f"http://127.0.0.1:{cluster.metrics_port}/metrics"
    wanted = ["ray_vllm_time_to_first_token_seconds_bucket", "ray_vllm_request_time_per_output_token_seconds_bucket",
              "ray_vllm_e2e_request_latency_seconds_bucket", "ray_vllm_request_queue_time_seconds_bucket",
              "ray_vllm_request_prefill_time_seconds_bucket", "ray_vllm_request_decode_time_seconds_bucket",
              "ray_vllm_prompt_tokens_total", "ray_vllm_generation_tokens_total",
              "ray_vllm_prefix_cache_queries_total", "ray_vllm_request_success_total",
              "ray_vllm_num_requests_running", "ray_vllm_num_requests_waiting",
              "ray_vllm_spec_decode_num_drafts_total", "ray_vllm_spec_decode_num_draft_tokens_total",
              "ray_vllm_spec_decode_num_accepted_tokens_total"]
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=10).text
        if all(f"\n{w}{{" in text for w in wanted) and 'protocol="completions"' in text:
            break
        time.sleep(1)
    missing = [w for w in wanted if f"\n{w}{{" not in text]
    assert not missing, missing
    ttft = series(text, "ray_vllm_time_to_first_token_seconds_count")
    assert ttft and all(f'model_name="{MODEL}"' in ln and 'engine="0"' in ln for ln in ttft), ttft
    host = "Ingress" if topology == "single" else MODEL_DEPLOYMENT
    assert any(f'deployment="{host}"' in ln for ln in ttft), ttft
    assert total(ttft) >= 1
    accepted = series(text, "ray_vllm_spec_decode_num_accepted_tokens_total")
    assert total(accepted) >= 1, accepted
    success = series(text, "ray_vllm_request_success_total")
    assert any('finished_reason="length"' in ln for ln in success), success
    requests = [ln for ln in text.splitlines() if ln.startswith("ray_llamaray_requests_total{")]
    assert any(re.search(r'protocol="completions".*status="ok"|status="ok".*protocol="completions"', ln)
               for ln in requests), requests


def test_a_keyless_server_answers_no_rebound_host_name(traced):
    """A keyless server (as `make run` serves one) and a page whose name now resolves to 127.0.0.1 (DNS
    rebinding): its requests carry the page's Host and reach no route (tests/graph/test_hostile_browser.py
    has what applies with keys too; app/http/browser_guard.py says why)."""
    _, cluster, _ = traced
    assert cluster.headers == {}  # no keys
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for host in ("evil.example", f"evil.example:{cluster.port}", f"localhost.evil.example:{cluster.port}"):
        r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, headers={"Host": host}, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
        r = httpx.get(f"{cluster.url}/v1/models", headers={"Host": host}, timeout=60)
        assert r.status_code == 403, (host, r.text)
    r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=60,
                   headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
    # Loopback names, addresses and the configured name ($LLAMARAY_ALLOWED_HOSTS in the replica) are served.
    for host in (f"localhost:{cluster.port}", f"[::1]:{cluster.port}", f"127.0.0.1:{cluster.port}", "llm.test"):
        r = httpx.get(f"{cluster.url}/v1/models", headers={"Host": host}, timeout=60)
        assert r.status_code == 200, (host, r.text)
