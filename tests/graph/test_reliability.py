"""Limits, deadlines, overload, disconnects, replica faults, API keys and metrics, through a
real graph configured with small limits so each case is quick to provoke."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time

import httpx
import pytest

from app.config.spec import deployment_name
from app.engine.jobs import StatsJob
from tests.support.openapi_spec import assert_valid
from tests.support.prometheus import series, total
from tests.support.serve_harness import MODEL, ServeCluster, free_port, load_config, sse_json

pytestmark = pytest.mark.timeout(900)
KEY = "sk-test-" + "x" * 24
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL_DEPLOYMENT = deployment_name(MODEL)


@pytest.fixture(scope="module")
def rcluster():
    # Mounted under a route prefix, with keys required: auth must hold wherever the app is mounted.
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "route_prefix": "/llm",
        "args": {
            "models": [{"id": MODEL, "n_ctx": 1024, "n_seq_max": 2, "max_tokens_limit": 900}],
            "limits": {"max_body_bytes": 65536, "max_messages": 50, "request_timeout_s": 4},
            "auth": {"required": True},
        },
        "deployments": [{"name": MODEL_DEPLOYMENT, "max_ongoing_requests": 2, "max_queued_requests": 2,
                         "autoscaling_config": {"target_ongoing_requests": 1}}],
    }]})
    with ServeCluster(config, num_cpus=2, env={"LLAMARAY_API_KEYS": f"other-key,{KEY}"},
                      metrics_port=free_port()) as c:
        yield c


@pytest.fixture(scope="module")
def http(rcluster):
    with httpx.Client(base_url=rcluster.url, timeout=120, headers=AUTH) as c:
        yield c


def chat(**kw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 8}
    body.update(kw)
    return body


def stats(rcluster):
    return rcluster.handle(MODEL_DEPLOYMENT).run.remote(StatsJob()).result()


def wait_idle(rcluster, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(rcluster)
        if s["running"] == 0 and s["waiting"] == 0:
            return s
        time.sleep(0.1)
    raise AssertionError(f"engine still busy: {stats(rcluster)}")


# ---- auth -------------------------------------------------------------------------------------

def test_api_keys(rcluster):
    url = rcluster.url
    assert url.endswith("/llm")  # under a non-root route_prefix (Serve keeps it in the ASGI path)
    assert httpx.get(f"{url}/openapi.json").status_code == 401  # fails closed: not only /v1
    r = httpx.post(f"{url}/v1/chat/completions", json=chat())
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert_valid("ErrorResponse", r.json())
    assert KEY not in r.text
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": KEY}).status_code == 401  # no scheme
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer other-key"}).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200  # stays open
    assert httpx.post(f"{url}/v1/chat/completions", json=chat(), headers=AUTH).status_code == 200


# ---- limits -----------------------------------------------------------------------------------

def test_limits_are_explicit_400s_and_413(http):
    r = http.post("/v1/chat/completions", content=b'{"model": "' + b"x" * 70000 + b'"}',
                  headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = http.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "hi"}] * 51))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and "50" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json=chat(max_tokens=901))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "900" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json=chat(max_completion_tokens=5000))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    r = http.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,x"}}]}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]"
    assert r.json()["error"]["code"] == "images_unsupported"
    r = http.post("/v1/chat/completions", json=chat(messages=[{"role": "tool", "content": "42"}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].tool_call_id"
    for resp in (r,):
        assert_valid("ErrorResponse", resp.json())


# ---- deadlines --------------------------------------------------------------------------------

def test_deadline_ends_stuck_requests(rcluster, http):
    # The grammar allows no end before 600 words (>= 600 tokens, several seconds here), so the
    # 4 s deadline, not the model, ends the request.
    long = chat(max_tokens=900, seed=1, grammar='root ::= w{600}\nw ::= [a-z]{1,8} " "')
    t0 = time.monotonic()
    r = http.post("/v1/chat/completions", json=long)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert time.monotonic() - t0 < 10
    wait_idle(rcluster)
    r = http.post("/v1/chat/completions", json={**long, "stream": True})
    assert r.status_code == 200
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert chunks[-1]["error"]["code"] == "timeout"
    assert not any(c.get("choices") and c["choices"][0]["finish_reason"] for c in chunks)  # no fake "stop"
    wait_idle(rcluster)


# ---- disconnects ------------------------------------------------------------------------------

def test_many_disconnects_free_all_slots(rcluster):
    body = chat(max_tokens=800, stream=True, temperature=1.0, min_p=0.0, top_k=0)

    def open_and_drop(_):
        with httpx.Client(base_url=rcluster.url, timeout=30, headers=AUTH) as c:
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    return r.status_code
                for line in r.iter_lines():
                    if '"content"' in line:
                        return 200
        return 200

    with cf.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(open_and_drop, range(4)))
    assert 200 in codes
    s = wait_idle(rcluster, timeout=10)
    assert s["running"] == 0


# ---- overload ---------------------------------------------------------------------------------

def test_overload_is_rejected_fast_and_accepted_requests_complete(rcluster):
    body = chat(max_tokens=4)

    def one(_):
        t0 = time.monotonic()
        r = httpx.post(f"{rcluster.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
        return r.status_code, time.monotonic() - t0, r.headers.get("retry-after"), r.json()

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    ok = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] != 200]
    assert ok and rejected, [r[0] for r in results]
    for status, elapsed, retry_after, body_ in rejected:
        assert status == 503 and body_["error"]["code"] == "overloaded" and retry_after == "1", (status, body_)
        assert elapsed < 5
    for _, _, _, body_ in ok:
        assert body_["usage"]["completion_tokens"] == 4
    wait_idle(rcluster)


# ---- metrics ----------------------------------------------------------------------------------

def test_metrics_reach_prometheus_endpoint(rcluster, http):
    assert http.post("/v1/chat/completions", json=chat()).status_code == 200
    url = f"http://127.0.0.1:{rcluster.metrics_port}/metrics"
    wanted = ["llamaray_requests_total", "llamaray_time_to_first_token_seconds", "llamaray_inter_token_latency_seconds",
              "llamaray_prompt_tokens_total", "llamaray_completion_tokens_total", "llamaray_running_sequences",
              "llamaray_waiting_sequences"]
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=10).text
        if all(w in text for w in wanted):
            break
        time.sleep(1)
    missing = [w for w in wanted if w not in text]
    assert not missing, missing
    # Ray exports application metrics with a `ray_` prefix and Serve's deployment/replica tags.
    ok_lines = [ln for ln in series(text, "ray_llamaray_requests_total") if 'status="ok"' in ln]
    assert ok_lines, [ln for ln in text.splitlines() if "llamaray_requests_total" in ln]
    assert 'deployment="ChatProcessor"' in ok_lines[0]  # the processing records each request
    assert total(ok_lines) >= 1
    running = series(text, "ray_llamaray_running_sequences")
    assert running and f'deployment="{MODEL_DEPLOYMENT}"' in running[0]


# ---- replica faults (last: it restarts the model replica) -------------------------------------

# A replica killed and replaced (~20 s with its cluster's end): make test-slow.
@pytest.mark.slow
def test_killed_model_replica_ends_streams_with_error_and_recovers(rcluster):
    pid = stats(rcluster)["pid"]
    body = chat(max_tokens=800, stream=True, temperature=1.0, min_p=0.0, top_k=0)
    with httpx.Client(base_url=rcluster.url, timeout=60, headers=AUTH) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = []
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 3:
                    os.kill(pid, signal.SIGKILL)
            events = [ln[len("data: "):] for ln in lines]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    last = json.loads(events[-2])
    assert last["error"]["code"] == "replica_unavailable", last
    assert not any('"finish_reason":"stop"' in e for e in events)
    # Serve replaces the replica; new requests succeed once it is healthy (the ChatProcessor's handle
    # learns of the new replica from Serve's controller, which may take a moment past /health).
    assert rcluster.wait_healthy(120)
    deadline, codes = time.monotonic() + 60, []
    while time.monotonic() < deadline and 200 not in codes:
        codes.append(httpx.post(f"{rcluster.url}/v1/chat/completions", json=chat(), headers=AUTH, timeout=60).status_code)
    assert codes[-1] == 200 and set(codes) <= {200, 503, 504}, codes
    assert stats(rcluster)["pid"] != pid
