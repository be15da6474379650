"""The HTTP surface with a fake backend: status codes, OpenAI error shapes, SSE framing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.api.errors import APIError, context_length_exceeded, invalid_request
from app.api.schemas import ChatCompletionRequest
from app.http.app import build_http_app
from app.http.model_cards import ModelCard
from app.generation.caller import Caller
from app.serving.health import HealthCache
from app.serving.models import LOADING, READY, ModelState
from tests.support.openapi_spec import assert_valid

URL = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def completion(model: str = "m", content: str = "hello") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


class FakeBackend:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.batches: list[list[dict[str, Any]]] = [
            [chunk({"role": "assistant", "content": ""})],
            [chunk({"content": "Hel"}), chunk({"content": "lo"})],
            [],
            [chunk({}, "stop")],
        ]
        self.fail_at: int | None = None  # raise before yielding batch #fail_at
        self.fail_with: BaseException = RuntimeError("secret internal detail")
        self.ready_result: dict[str, bool] | BaseException = {"m": True}
        self.complete_result: dict[str, Any] | BaseException = completion()

    async def respond(self, request: ChatCompletionRequest, caller: Caller) -> dict[str, Any]:
        self.requests.append(request)
        if isinstance(self.complete_result, BaseException):
            raise self.complete_result
        return self.complete_result

    async def stream(self, request: ChatCompletionRequest, caller: Caller):
        self.requests.append(request)
        for i, batch in enumerate(self.batches):
            if i == self.fail_at:
                raise self.fail_with
            await asyncio.sleep(0)
            yield batch
        if self.fail_at is not None and self.fail_at >= len(self.batches):
            raise self.fail_with

    async def states(self) -> dict[str, ModelState]:
        if isinstance(self.ready_result, BaseException):
            raise self.ready_result
        return {m: READY if v is True else ModelState("unavailable", v) if isinstance(v, str) else LOADING
                for m, v in self.ready_result.items()}


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(backend) -> TestClient:
    models = [ModelCard("m"), ModelCard("org/other-model", owned_by="me", created=5)]
    app = build_http_app(backend, models, health=HealthCache(backend.states, [m.id for m in models]))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def sse_events(text: str) -> list:
    assert text.endswith("\n\n"), text[-50:]
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def assert_error(resp, status: int, *, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert_valid("ErrorResponse", body)
    err = body["error"]
    assert err["type"] == type
    assert err["code"] == code
    assert err["param"] == param
    assert err["message"]
    return err


# ---- non-streaming -----------------------------------------------------------------------------

def test_non_stream_success_passes_backend_body_through(client, backend):
    backend.complete_result = completion(content="unique-body-42")
    resp = client.post(URL, json={**BODY, "temperature": 0.5, "extra_field": 1})
    assert resp.status_code == 200
    assert resp.json() == completion(content="unique-body-42")
    assert_valid("CreateChatCompletionResponse", resp.json())
    # the backend gets the request validated here, once: the typed model, without unknown fields
    (sent,) = backend.requests
    assert isinstance(sent, ChatCompletionRequest)
    assert sent.model == "m" and sent.temperature == 0.5
    assert [m.model_dump(exclude_none=True) for m in sent.messages] == [{"role": "user", "content": "hi"}]
    assert "extra_field" not in sent.model_dump()


def test_unknown_model_404(client, backend):
    resp = client.post(URL, json={**BODY, "model": "gpt-17"})
    err = assert_error(resp, 404, code="model_not_found", param="model")
    assert "gpt-17" in err["message"]
    assert backend.requests == []


def test_malformed_json_400(client, backend):
    resp = client.post(URL, content=b'{"model": "m", "messages": [', headers={"content-type": "application/json"})
    err = assert_error(resp, 400)
    assert "JSON" in err["message"]
    assert backend.requests == []


def test_non_utf8_body_400(client):
    resp = client.post(URL, content=b"\xff\xfe{}", headers={"content-type": "application/json"})
    assert_error(resp, 400)


def test_body_not_object_400(client):
    assert_error(client.post(URL, json=[BODY]), 400)


def test_validation_error_400_with_param(client):
    resp = client.post(URL, json={**BODY, "temperature": 5})
    assert_error(resp, 400, code="invalid_value", param="temperature")


def test_n_out_of_range_400(client):
    assert_error(client.post(URL, json={**BODY, "n": 129}), 400, code="invalid_value", param="n")
    assert_error(client.post(URL, json={**BODY, "n": 0}), 400, code="invalid_value", param="n")


def test_stream_options_without_stream_400(client, backend):
    resp = client.post(URL, json={**BODY, "stream_options": {"include_usage": True}})
    assert_error(resp, 400, param="stream_options")
    resp = client.post(URL, json={**BODY, "stream": False, "stream_options": {"include_usage": True}})
    assert_error(resp, 400, param="stream_options")
    assert backend.requests == []


def test_backend_api_error_keeps_status(client, backend):
    backend.complete_result = context_length_exceeded(1024, 2000, None)
    resp = client.post(URL, json=BODY)
    assert_error(resp, 400, code="context_length_exceeded", param="messages")


def test_backend_crash_is_generic_500(client, backend):
    backend.complete_result = RuntimeError("secret internal detail")
    resp = client.post(URL, json=BODY)
    err = assert_error(resp, 500, code="internal_error", type="server_error")
    assert "secret" not in err["message"]


def test_wrapped_api_error_keeps_status(client, backend):
    class RemoteWrapper(Exception):  # shaped like Ray's RayTaskError: original in .cause
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    backend.complete_result = RemoteWrapper(APIError("busy", status=503, type="server_error", code="overloaded"))
    assert_error(client.post(URL, json=BODY), 503, code="overloaded", type="server_error")


# ---- streaming ---------------------------------------------------------------------------------

def test_stream_headers_and_single_done(client, backend):
    with client.stream("POST", URL, json={**BODY, "stream": True}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["x-accel-buffering"] == "no"
        text = resp.read().decode()
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert text.count("data: [DONE]") == 1
    chunks = events[:-1]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}, {}]
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
    assert backend.requests[0].stream is True


def test_stream_api_error_before_first_batch_keeps_http_status(client, backend):
    backend.fail_at = 0
    backend.fail_with = invalid_request("The grammar could not be parsed.", param="grammar", code="invalid_grammar")
    resp = client.post(URL, json={**BODY, "stream": True})
    assert not resp.headers["content-type"].startswith("text/event-stream")
    assert_error(resp, 400, code="invalid_grammar", param="grammar")
    assert "[DONE]" not in resp.text


def test_stream_503_before_first_batch(client, backend):
    backend.fail_at = 0
    backend.fail_with = APIError("engine down", status=503, type="server_error", code="engine_unavailable")
    assert_error(client.post(URL, json={**BODY, "stream": True}), 503, code="engine_unavailable",
                 type="server_error")


def test_stream_exception_after_first_batch_is_error_event_then_done(client, backend):
    backend.fail_at = 2
    resp = client.post(URL, json={**BODY, "stream": True})
    assert resp.status_code == 200
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert [c["choices"][0]["delta"] for c in events[:3]] == [
        {"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}]
    error_event = events[3]
    assert len(events) == 5
    assert_valid("ErrorResponse", error_event)
    assert error_event["error"]["code"] == "internal_error"
    assert error_event["error"]["type"] == "server_error"
    assert "secret" not in error_event["error"]["message"]
    assert resp.text.count("data: [DONE]") == 1


def test_stream_api_error_after_first_batch_keeps_its_body(client, backend):
    backend.fail_at = 1
    backend.fail_with = APIError("The model engine stopped.", status=503, type="server_error",
                                 code="engine_unavailable")
    resp = client.post(URL, json={**BODY, "stream": True})
    events = sse_events(resp.text)
    assert len(events) == 3 and events[-1] == "[DONE]"
    assert events[1] == {"error": {"message": "The model engine stopped.", "type": "server_error",
                                   "param": None, "code": "engine_unavailable"}}
    assert_valid("ErrorResponse", events[1])


def test_stream_error_after_last_batch(client, backend):
    backend.fail_at = len(backend.batches)
    events = sse_events(client.post(URL, json={**BODY, "stream": True}).text)
    assert len(events) == 6  # 4 chunks, the error, [DONE]
    assert events[3]["choices"][0]["finish_reason"] == "stop"
    assert events[4]["error"]["code"] == "internal_error"
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1


def test_stream_empty_first_batch(client, backend):
    backend.batches = [[], [chunk({"content": "x"})]]
    events = sse_events(client.post(URL, json={**BODY, "stream": True}).text)
    assert events == [chunk({"content": "x"}), "[DONE]"]


def test_stream_unknown_model_404(client, backend):
    assert_error(client.post(URL, json={**BODY, "model": "nope", "stream": True}), 404,
                 code="model_not_found", param="model")


# ---- other routes ------------------------------------------------------------------------------

def test_unknown_path_404(client):
    resp = client.get("/v1/does-not-exist")
    err = assert_error(resp, 404, code="not_found")
    assert "/v1/does-not-exist" in err["message"]


def test_wrong_method_405(client):
    resp = client.get(URL)
    err = assert_error(resp, 405, code="method_not_allowed")
    assert "GET" in err["message"]
    resp = client.post("/v1/models", json={})
    assert_error(resp, 405, code="method_not_allowed")


# Regression: the 405 once dropped the `Allow` header (RFC 9110 requires it).
def test_wrong_method_405_has_allow_header(client):
    resp = client.get(URL)
    assert resp.status_code == 405
    assert resp.headers.get("allow") == "POST"


def test_health_ok(client, backend):
    backend.ready_result = {"m": True, "org/other-model": True}
    resp = client.get("/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "models": {"m": True, "org/other-model": True},
                           "states": {"m": "ready", "org/other-model": "ready"}}


@pytest.mark.parametrize("ready", [
    {"m": True, "org/other-model": False},
    {"m": True},  # a model missing from the answer is not ready
    {},
])
def test_health_not_ready_503(client, backend, ready):
    backend.ready_result = ready
    resp = client.get("/health")
    assert resp.status_code == 503
    assert resp.json()["status"] == "loading"


def test_health_says_why_a_model_cannot_serve(client, backend):
    why = "model 'm': the startup self-check failed (killed by SIGSEGV)"
    backend.ready_result = {"m": why, "org/other-model": True}
    resp = client.get("/health")
    assert resp.status_code == 503
    assert resp.json() == {"status": "unavailable", "models": {"m": False, "org/other-model": True},
                           "states": {"m": "unavailable", "org/other-model": "ready"}, "errors": {"m": why}}


def test_health_backend_raises_503(client, backend):
    backend.ready_result = RuntimeError("replica gone")
    resp = client.get("/health")
    assert resp.status_code == 503
    assert resp.json() == {"status": "loading", "models": {"m": False, "org/other-model": False},
                           "states": {"m": "loading", "org/other-model": "loading"}}


def test_list_models(client):
    resp = client.get("/v1/models")
    assert resp.status_code == 200
    body = resp.json()
    assert_valid("ListModelsResponse", body)
    assert [m["id"] for m in body["data"]] == ["m", "org/other-model"]
    assert body["data"][1] == {"id": "org/other-model", "object": "model", "created": 5, "owned_by": "me"}


def test_get_model_with_slash_in_id(client):
    resp = client.get("/v1/models/org/other-model")
    assert resp.status_code == 200
    assert_valid("Model", resp.json())
    assert resp.json()["id"] == "org/other-model"


def test_get_unknown_model_404(client):
    assert_error(client.get("/v1/models/nope"), 404, code="model_not_found", param="model")


def test_every_failure_is_logged_once_with_its_cause_and_refusals_as_one_info_line(client, backend, caplog):
    import logging
    import pickle

    from app.http import errors

    errors.REFUSALS._last.clear()
    caplog.set_level(logging.INFO, logger="llamaray")
    backend.complete_result = APIError("busy", status=503, type="server_error", code="overloaded")  # busy: refused
    client.post(URL, json=BODY, headers={"x-request-id": "req-1"})
    backend.complete_result = RuntimeError("secret internal detail")
    client.post(URL, json=BODY)
    backend.complete_result = pickle.loads(pickle.dumps(APIError("decode failed", status=500, code="internal_error",
                                                                  logged=True)))  # logged where it was made
    client.post(URL, json=BODY)
    backend.complete_result = APIError("timed out", status=504, type="server_error", code="timeout")
    client.post(URL, json=BODY)
    backend.complete_result = invalid_request("bad", code="invalid_value")  # a 4xx: the client's, not the server's
    client.post(URL, json=BODY)
    records = [(r.name, r.levelname) for r in caplog.records]
    assert records == [("llamaray.refusals", "INFO"), ("llamaray.server", "ERROR"), ("llamaray.server", "WARNING"),
                       ("llamaray.refusals", "INFO")]
    assert "refused 503 overloaded: request req-1" in caplog.records[0].getMessage()
    assert caplog.records[1].exc_info and "secret internal detail" in repr(caplog.records[1].exc_info[1])
    assert "504 timeout: timed out" in caplog.records[2].getMessage()
    assert "refused 400 invalid_value" in caplog.records[3].getMessage()
    assert not any(r.exc_info for r in caplog.records if r.name == "llamaray.refusals")


def test_a_5xx_ending_a_stream_is_logged_too(client, backend, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="llamaray.server")
    backend.fail_at = 2
    backend.fail_with = APIError("engine stopped", status=503, type="server_error", code="engine_unavailable")
    client.post(URL, json={**BODY, "stream": True})
    assert any("503 engine_unavailable" in r.getMessage() for r in caplog.records)


def test_adapters_are_listed_as_models_of_their_base(backend):
    """model_cards: each LoRA adapter as `<base>:<adapter>` after its base, `parent` and `root` the base (as vLLM
    lists LoRA modules); /health stays per model."""
    from dataclasses import dataclass

    from app.http.model_cards import model_cards

    @dataclass
    class Spec:
        id: str
        owned_by: str = "me"
        adapters: tuple = ()

    @dataclass
    class Adapter:
        name: str

    cards = model_cards([Spec("m", adapters=(Adapter("a1"), Adapter("a2"))), Spec("e")])
    app = build_http_app(backend, cards, health=HealthCache(backend.states, ["m", "e"]))
    with TestClient(app, raise_server_exceptions=False) as c:
        body = c.get("/v1/models").json()
        assert_valid("ListModelsResponse", body)
        assert [(m["id"], m.get("parent"), m.get("root")) for m in body["data"]] == [
            ("m", None, None), ("m:a1", "m", "m"), ("m:a2", "m", "m"), ("e", None, None)]
        assert c.get("/v1/models/m:a2").json()["parent"] == "m"
        assert set(c.get("/health").json()["models"]) == {"m", "e"}
