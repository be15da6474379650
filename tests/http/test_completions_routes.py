"""/v1/completions, /tokenize and /detokenize at the HTTP edge, with a fake backend: validation and
refusals (OpenAI error bodies naming the field), pass-through, SSE framing, auth."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.api.errors import APIError
from app.api.schemas import CompletionRequest, DetokenizeRequest, TokenizeRequest
from app.http.auth import KeyChecker
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from tests.support.openapi_spec import assert_valid, assert_valid_completion

KEY = "sk-test-" + "c" * 24


def body(text: str = "hi", finish: str | None = "length") -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


class Backend:
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.error: BaseException | None = None

    async def respond(self, request: Any, caller: Any) -> dict[str, Any]:
        self.requests.append(request)
        if isinstance(request, TokenizeRequest):
            return {"tokens": [1, 2], "count": 2, "max_model_len": 64}
        if self.error:
            raise self.error
        if isinstance(request, DetokenizeRequest):
            return {"prompt": "ab"}
        return {**body(), "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    async def stream(self, request: CompletionRequest, caller: Any):
        self.requests.append(request)
        if self.error:
            raise self.error
        yield [body("a", None), body("b", None)]
        yield [body("", "stop")]




@pytest.fixture
def backend() -> Backend:
    return Backend()


@pytest.fixture
def client(backend):
    with TestClient(build_http_app(backend, [ModelCard("m")]), raise_server_exceptions=False) as c:
        yield c


def error(resp, status: int, param: str | None, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert_valid("ErrorResponse", resp.json())
    err = resp.json()["error"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def test_completion_passes_through(client, backend):
    r = client.post("/v1/completions", json={"model": "m", "prompt": ["a", "b"], "n": 2, "logprobs": 5,
                                            "echo": True, "best_of": 2, "max_tokens": 0, "suffix": ""})
    assert r.status_code == 200
    assert_valid_completion(r.json())
    (req,) = backend.requests
    assert isinstance(req, CompletionRequest)
    assert req.prompts == ["a", "b"] and req.n == 2 and req.logprobs == 5 and req.echo and req.max_tokens == 0


def test_completion_stream_ends_with_one_done(client):
    r = client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = r.text.split("\n\n")[:-1]
    assert blocks[-1] == "data: [DONE]" and blocks.count("data: [DONE]") == 1
    for block in blocks[:-1]:
        assert_valid_completion(json.loads(block.removeprefix("data: ")))


def test_completion_stream_error_before_output_keeps_status(client, backend):
    backend.error = APIError("too long", status=400, param="prompt", code="context_length_exceeded",
                             type="invalid_request_error")
    r = client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True})
    error(r, 400, "prompt", "context_length_exceeded")


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"prompt": [1, 2, 3]}, "prompt", "unsupported_parameter"),
    ({"prompt": [[1, 2]]}, "prompt", "unsupported_parameter"),
    ({"prompt": []}, "prompt", "invalid_value"),
    ({"prompt": None}, "prompt", None),
    ({"suffix": "end", "echo": True}, "echo", "unsupported_parameter"),
    ({"best_of": 3}, "best_of", "unsupported_parameter"),
    ({"n": 3, "best_of": 2}, None, "invalid_value"),
    ({"logprobs": 21}, "logprobs", "invalid_value"),
    ({"logprobs": True}, "logprobs", "invalid_value"),
    ({"max_tokens": -1}, "max_tokens", "invalid_value"),
    ({"echo": "yes"}, "echo", "invalid_value"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    ({"prompt": ["a"] * 65, "n": 2}, "prompt", "unsupported_parameter"),
    ({"stream_options": {"include_usage": True}}, "stream_options", None),
])
def test_completion_refusals(client, backend, fields, param, code):
    r = client.post("/v1/completions", json={"model": "m", "prompt": "x", **fields})
    error(r, 400, param, code)
    assert not backend.requests


def test_completion_unknown_model(client, backend):
    error(client.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "model", "model_not_found")
    error(client.post("/tokenize", json={"model": "nope", "prompt": "x"}), 404, "model", "model_not_found")
    error(client.post("/detokenize", json={"model": "nope", "tokens": []}), 404, "model", "model_not_found")
    assert not backend.requests


def test_tokenize_and_detokenize(client, backend):
    r = client.post("/tokenize", json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "add_generation_prompt": False})
    assert r.status_code == 200 and r.json() == {"tokens": [1, 2], "count": 2, "max_model_len": 64}
    assert backend.requests[-1].add_generation_prompt is False
    r = client.post("/detokenize", json={"model": "m", "tokens": [1, 2]})
    assert r.status_code == 200 and r.json() == {"prompt": "ab"}


@pytest.mark.parametrize(("path", "payload", "param"), [
    ("/tokenize", {"model": "m"}, None),
    ("/tokenize", {"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}, None),
    ("/tokenize", {"model": "m", "prompt": 3}, "prompt"),
    ("/tokenize", {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/tokenize", {"model": "m", "prompt": "x", "add_special": 1}, "add_special"),
    ("/detokenize", {"model": "m", "tokens": ["1"]}, "tokens[0]"),
    ("/detokenize", {"model": "m"}, "tokens"),
])
def test_tokenizer_refusals(client, backend, path, payload, param):
    error(client.post(path, json=payload), 400, param)
    assert not backend.requests


def test_detokenize_error_from_the_model_keeps_its_param(client, backend):
    backend.error = APIError("not a token", status=400, param="tokens[1]", code="invalid_token",
                             type="invalid_request_error")
    error(client.post("/detokenize", json={"model": "m", "tokens": [1, 10**9]}), 400, "tokens[1]", "invalid_token")


def test_too_many_messages_to_tokenize(backend):
    app = build_http_app(backend, [ModelCard("m")], ServerSettings(max_messages=1))
    with TestClient(app) as client:
        r = client.post("/tokenize", json={"model": "m", "messages": [{"role": "user", "content": "x"}] * 2})
        error(r, 400, "messages", "too_many_messages")


def test_routes_need_a_key(backend):
    app = build_http_app(backend, [ModelCard("m")], ServerSettings(keys=KeyChecker((KEY.encode(),))))
    with TestClient(app) as client:
        for path, payload in (("/v1/completions", {"model": "m", "prompt": "x"}),
                              ("/tokenize", {"model": "m", "prompt": "x"}),
                              ("/detokenize", {"model": "m", "tokens": [1]})):
            error(client.post(path, json=payload), 401, None, "invalid_api_key")
            assert client.post(path, json=payload, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert len(backend.requests) == 3
