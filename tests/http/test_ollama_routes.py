"""Ollama's routes at the HTTP edge, over a fake processing: every failure on a path under /api/ is Ollama's
`{"error": "..."}` with its status (a missing key, an unknown path or method, a malformed, oversized, non-JSON or
non-finite body), refused before the processing is reached; the routes that would change a cluster's models
(pull, push, create, copy, delete, blobs) are refused whatever the key, without reading the body; `name:tag` names
resolve at the edge and another key's model is a 404 like a missing one; streams are NDJSON that the official
client reads, kept alive with records that add nothing and ended by an `{"error"}` line when they fail under way;
a web page can reach none of it on a server without keys; /metrics serves only this application's series, and of
those only what the key may see."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import ollama
import pytest
from starlette.testclient import TestClient

from app.api.errors import APIError, overloaded
from app.http.app import build_http_app
from app.http.auth import KeyChecker
from app.http.browser_guard import browser_policy
from app.http.endpoints import ServerSettings
from app.http.metrics_page import NodeMetrics
from app.http.model_cards import ModelCard
from app.ollama_api.schemas import OllamaChatRequest, OllamaGenerateRequest
from app.tenants.policies import key_hash
from app.tenants.registry import KeyRegistry
from tests.support.ollama_client import drain, ollama_client

ADMIN, USER, NARROW = "sk-admin-" + "a" * 24, "sk-user-" + "u" * 24, "sk-narrow-" + "n" * 24
LOCAL = "http://localhost:8000"
CARDS = [ModelCard("m"), ModelCard("m:a1", parent="m"), ModelCard("secret"), ModelCard("tail-1", pool="tail")]
CHAT = {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = [("POST", "/api/pull", {"model": "llama3"}), ("POST", "/api/push", {"model": "m"}),
           ("POST", "/api/create", {"model": "x", "from": "m"}), ("POST", "/api/copy", {"source": "m", "destination": "y"}),
           ("DELETE", "/api/delete", {"model": "m"})]


def record(name: str, content: str, done: bool = False, **fields: Any) -> dict[str, Any]:
    return {"model": name, "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", "content": content},
            "done": done, **fields}


class Backend:
    """Answers with what it was asked (the request as the processing got it); streams two records, after
    `wait_s`, or fails with `fail` once the stream is under way."""

    def __init__(self, wait_s: float = 0.0, fail: Exception | None = None) -> None:
        self.seen: list[Any] = []
        self.wait_s, self.fail = wait_s, fail

    async def respond(self, request, caller) -> dict[str, Any]:
        self.seen.append(request)
        if not hasattr(request, "model"):  # /api/tags, /api/ps, /api/version
            return {"version": "0"}
        return record(request.name, f"model {request.model}", True, done_reason="stop")

    async def stream(self, request, caller):
        self.seen.append(request)
        yield []
        await asyncio.sleep(self.wait_s)
        yield [record(request.name, "Hel")]
        if self.fail is not None:
            raise self.fail
        yield [record(request.name, "lo", True, done_reason="stop", total_duration=5, load_duration=0,
                      prompt_eval_count=3, prompt_eval_duration=1, eval_count=2, eval_duration=1)]


def keys_file(tmp_path) -> KeyChecker:
    path = tmp_path / "keys.yaml"
    path.write_text(f"""keys:
  - {{name: ops, key_sha256: {key_hash(ADMIN)}, admin: true}}
  - {{name: team, key_sha256: {key_hash(USER)}}}
  - {{name: narrow, key_sha256: {key_hash(NARROW)}, models: [m]}}
""")
    return KeyChecker(registry=KeyRegistry([], str(path)))


def keyed(backend, tmp_path, metrics: NodeMetrics | None = None, **settings) -> TestClient:
    app = build_http_app(backend, CARDS, ServerSettings(keys=keys_file(tmp_path), browser=browser_policy(False),
                                                        **settings), node_metrics=metrics)
    return TestClient(app, base_url=LOCAL, raise_server_exceptions=False)


def keyless(backend, metrics: NodeMetrics | None = None) -> TestClient:
    app = build_http_app(backend, CARDS, ServerSettings(browser=browser_policy(True)), node_metrics=metrics)
    return TestClient(app, base_url=LOCAL, raise_server_exceptions=False)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def ollama_error(r, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


def test_every_failure_under_api_is_ollamas_shape_and_reaches_nothing(tmp_path):
    backend = Backend()
    with keyed(backend, tmp_path, max_body_bytes=4096) as c:
        assert "key" in ollama_error(c.post("/api/chat", json=CHAT), 401)
        assert "key" in ollama_error(c.get("/api/tags"), 401)
        ollama_error(c.post("/api/unknown", json={}, headers=bearer(USER)), 404)
        ollama_error(c.get("/api/chat", headers=bearer(USER)), 405)
        for body in ({**CHAT, "extra": 1}, {**CHAT, "stream": "no"}, {"messages": []}, [CHAT]):
            ollama_error(c.post("/api/chat", json=body, headers=bearer(USER)), 400)
        for number in ("NaN", "Infinity", "-1e999"):
            raw = json.dumps(CHAT)[:-1] + ', "options": {"temperature": %s}}' % number
            message = ollama_error(c.post("/api/chat", content=raw, headers={**bearer(USER), "content-type":
                                                                              "application/json"}), 400)
            assert "not finite" in message
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        ollama_error(c.post("/api/chat", json=big, headers=bearer(USER)), 413)
        ollama_error(c.post("/api/generate", content=b'{"model": "m"}', headers={**bearer(USER), "content-type":
                                                                                 "text/plain"}), 415)
        missing = ollama_error(c.post("/api/chat", json={**CHAT, "model": "nothing"}, headers=bearer(USER)), 404)
        assert 'model "nothing" not found' in missing
        # Another key's model answers exactly as a missing one (not the key's to know it exists).
        hidden = ollama_error(c.post("/api/chat", json={**CHAT, "model": "secret:latest"}, headers=bearer(NARROW)), 404)
        absent = ollama_error(c.post("/api/chat", json={**CHAT, "model": "secrex:latest"}, headers=bearer(NARROW)), 404)
        assert hidden.replace("secret", "X") == absent.replace("secrex", "X")
        for path, body in (("/api/embed", {"model": "m:a1", "input": "x"}), ("/api/show", {"model": "m:a1"})):
            ollama_error(c.post(path, json=body, headers=bearer(NARROW)), 404)  # an adapter it was not given
    assert backend.seen == []


@pytest.mark.parametrize("root_path", ["", "/llm"])
def test_a_key_is_needed_under_any_prefix(tmp_path, root_path):
    app = build_http_app(Backend(), CARDS, ServerSettings(keys=keys_file(tmp_path)))
    with TestClient(app, root_path=root_path) as c:
        for path in ("/api/tags", "/api/ps", "/api/version", "/api/anything"):
            assert "key" in ollama_error(c.get(root_path + path), 401)
        assert c.get(root_path + "/metrics").json()["error"]["code"] == "invalid_api_key"
        assert c.get(root_path + "/api/version", headers=bearer(USER)).status_code == 200


@pytest.mark.parametrize("key", [ADMIN, USER])
def test_model_management_is_refused_whatever_the_key(tmp_path, key):
    backend = Backend()
    with keyed(backend, tmp_path) as c:
        for method, path, body in REFUSED:
            message = ollama_error(c.request(method, path, json=body, headers=bearer(key)), 403)
            assert "config" in message and path in message
        upload = c.post("/api/blobs/sha256:" + "0" * 64, content=b"\x00GGUF" * 1000,
                        headers={**bearer(key), "content-type": "application/octet-stream"})
        assert "config" in ollama_error(upload, 403)  # refused before its body is read (no JSON to find)
        assert c.head("/api/blobs/sha256:" + "0" * 64, headers=bearer(key)).status_code == 403

        async def official() -> None:
            client = ollama_client(c.app, key)
            for call in (client.pull("llama3"), client.delete("m"), client.copy("m", "n"),
                         client.create("x", from_="m")):
                with pytest.raises(ollama.ResponseError) as info:
                    await call
                assert info.value.status_code == 403 and "config" in info.value.error
        asyncio.run(official())
    assert backend.seen == []


def test_names_resolve_at_the_edge_and_replies_echo_the_clients(tmp_path):
    backend = Backend()
    with keyed(backend, tmp_path) as c:
        for sent, resolved in (("m:latest", "m"), ("m", "m"), ("m:a1", "m:a1"), ("tail-1:latest", "tail-1")):
            r = c.post("/api/chat", json={**CHAT, "model": sent, "stream": False}, headers=bearer(USER))
            assert r.status_code == 200 and r.json()["model"] == sent and r.json()["message"]["content"] == \
                f"model {resolved}", r.text
        assert c.post("/api/generate", json={"model": "m:latest", "prompt": "x", "stream": False},
                      headers=bearer(NARROW)).status_code == 200
    assert [type(r) for r in backend.seen[-2:]] == [OllamaChatRequest, OllamaGenerateRequest]
    assert [r.model for r in backend.seen] == ["m", "m", "m:a1", "tail-1", "m"]


def lines(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_streams_are_ndjson_the_client_reads(tmp_path):
    backend = Backend()
    with keyed(backend, tmp_path) as c:
        r = c.post("/api/chat", json=CHAT, headers=bearer(USER))  # Ollama streams by default
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        records = lines(r.text)
        assert [x["message"]["content"] for x in records] == ["Hel", "lo"] and records[-1]["done"]
        parts = asyncio.run(drain(ollama_client(c.app, USER).chat(model="m:latest", messages=CHAT["messages"],
                                                                 stream=True)))
        assert "".join(p.message.content for p in parts) == "Hello" and parts[-1].done_reason == "stop"


def test_a_waiting_stream_is_kept_alive_by_records_that_add_nothing(tmp_path):
    backend = Backend(wait_s=0.3)
    with keyed(backend, tmp_path, stream_keepalive_s=0.05) as c:
        for path, body in (("/api/chat", CHAT), ("/api/generate", {"model": "m", "prompt": "x"})):
            records = lines(c.post(path, json=body, headers=bearer(USER)).text)
            ticks = [x for x in records if "model" not in x]
            assert len(ticks) >= 2 and records[:len(ticks)] == ticks, records
            for tick in ticks:  # read by the client's own types, each adding nothing
                assert ollama.ChatResponse(**tick).message.content == "" and not tick["done"]
                assert ollama.GenerateResponse(**tick).response == ""


def test_a_stream_that_fails_under_way_ends_with_one_error_line(tmp_path):
    backend = Backend(fail=overloaded("The server is overloaded; retry shortly."))
    with keyed(backend, tmp_path) as c:
        records = lines(c.post("/api/chat", json=CHAT, headers=bearer(USER)).text)
        assert records[0]["message"]["content"] == "Hel" and records[-1] == {
            "error": "The server is overloaded; retry shortly."}
        with pytest.raises(ollama.ResponseError, match="overloaded"):
            asyncio.run(drain(ollama_client(c.app, USER).chat(model="m", messages=CHAT["messages"], stream=True)))


def test_a_web_page_reaches_no_ollama_route_of_a_keyless_server():
    backend = Backend()
    with keyless(backend) as c:
        assert c.post("/api/chat", json={**CHAT, "stream": False}).status_code == 200  # the local user
        seen = len(backend.seen)
        for headers in ({"Origin": "https://evil.example"}, {"Host": "evil.example:8000"}):
            for method, path, body in (("POST", "/api/chat", CHAT), ("GET", "/api/tags", None),
                                       ("POST", "/api/embed", {"model": "m", "input": "x"}), ("GET", "/metrics", None)):
                r = c.request(method, path, json=body, headers=headers)
                assert r.status_code == 403, (path, headers, r.text)
        ollama_error(c.post("/api/chat", content=json.dumps(CHAT), headers={"content-type": "text/plain"}), 415)
        assert len(backend.seen) == seen


EXPORT = """# HELP ray_llamaray_requests_total API requests.
# TYPE ray_llamaray_requests_total counter
ray_llamaray_requests_total{application="app",model="m",adapter="",protocol="ollama",status="ok"} 3.0
ray_llamaray_requests_total{application="app",model="m",adapter="a1",protocol="chat",status="ok"} 1.0
ray_llamaray_requests_total{application="app",model="secret",adapter="",protocol="chat",status="ok"} 2.0
ray_llamaray_requests_total{application="other",model="m",adapter="",protocol="chat",status="ok"} 9.0
# TYPE ray_llamaray_tenant_requests_total counter
ray_llamaray_tenant_requests_total{application="app",key="narrow",model="m"} 1.0
ray_llamaray_tenant_requests_total{application="app",key="team",model="m"} 5.0
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{application="app",deployment="LlamaModel-m",engine="0",model_name="m"} 1.0
ray_vllm_num_requests_running{application="app",deployment="LlamaModel-secret",engine="0",model_name="secret"} 0.0
ray_vllm_num_requests_running{application="vllm-team",deployment="X",engine="0",model_name="m"} 4.0
# TYPE ray_llamaray_route_decisions_total counter
ray_llamaray_route_decisions_total{application="app",deployment="LlamaModel-secret",reason="prefix"} 7.0
# TYPE ray_node_cpu_utilization gauge
ray_node_cpu_utilization{NodeAddress="10.0.0.1"} 50.0
broken{line 1
"""


def metric_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def test_metrics_are_the_applications_own_and_each_key_reads_what_it_may_see(tmp_path):
    async def read() -> str:
        return EXPORT

    with keyed(Backend(), tmp_path, NodeMetrics(read, "app")) as c:
        assert c.get("/metrics").status_code == 401
        every = c.get("/metrics", headers=bearer(ADMIN))
        assert every.status_code == 200 and every.headers["content-type"].startswith("text/plain; version=0.0.4")
        admin = metric_lines(every.text)
        assert len(admin) == 8 and not any('application="other"' in x or "vllm-team" in x or "ray_node" in x
                                           or "broken" in x for x in admin)
        assert "# TYPE ray_vllm_num_requests_running gauge" in every.text
        team = metric_lines(c.get("/metrics", headers=bearer(USER)).text)  # every model, its own key's series
        assert team == admin - {x for x in admin if 'key="narrow"' in x}
        narrow = metric_lines(c.get("/metrics", headers=bearer(NARROW)).text)  # model m alone, no adapter
        assert narrow == {
            'ray_llamaray_requests_total{application="app",model="m",adapter="",protocol="ollama",status="ok"} 3.0',
            'ray_llamaray_tenant_requests_total{application="app",key="narrow",model="m"} 1.0',
            'ray_vllm_num_requests_running{application="app",deployment="LlamaModel-m",engine="0",model_name="m"} 1.0'}
    with keyless(Backend(), NodeMetrics(read, "app")) as c:
        assert metric_lines(c.get("/metrics").text) == admin  # the local user of a server without keys


def test_metrics_that_cannot_be_read_say_so(tmp_path):
    async def down() -> str:
        raise ConnectionRefusedError("connection refused")

    with keyed(Backend(), tmp_path, NodeMetrics(down, "app")) as c:
        r = c.get("/metrics", headers=bearer(ADMIN))
        assert r.status_code == 503 and r.json()["error"]["code"] == "metrics_unavailable"
    with keyed(Backend(), tmp_path) as c:
        assert c.get("/metrics", headers=bearer(ADMIN)).status_code == 404  # an app not on Ray


def test_a_refusal_the_processing_raises_keeps_its_status(tmp_path):
    class Refusing(Backend):
        async def respond(self, request, caller):
            raise APIError("keep_alive: 'soon' is not a duration", status=400, code="invalid_keep_alive")

    with keyed(Refusing(), tmp_path) as c:
        assert "duration" in ollama_error(c.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": "soon"},
                                                 headers=bearer(USER)), 400)
