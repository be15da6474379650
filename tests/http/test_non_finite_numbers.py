"""A JSON body holding a number that is not finite (`NaN`, `Infinity`, or one past the float range such as
`1e999`, which Python reads as inf) is refused at the edge, on every route that takes a JSON body, as a 400 in
the route's protocol shape: such a number could never be written back as JSON (a tool schema's `default` is
echoed in a response, then stored)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from app.http.app import build_http_app
from app.http.model_cards import ModelCard
from app.generation.caller import Caller
from tests.support.openapi_spec import assert_valid

BAD_NUMBERS = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1" + "0" * 400 + ".0"]
ROUTES = [
    ("/v1/chat/completions", '{"model": "m", "messages": [], "temperature": %s}'),
    ("/v1/completions", '{"model": "m", "prompt": "x", "temperature": %s}'),
    ("/infill", '{"model": "m", "input_prefix": "a", "input_suffix": "b", "temperature": %s}'),
    ("/v1/responses", '{"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", '
                      '"parameters": {"type": "object", "properties": {"n": {"type": "number", "default": %s}}}}]}'),
    ("/v1/responses", '{"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n", '
                      '"schema": {"type": "number", "x-limit": %s}}}}'),
    ("/v1/responses/input_tokens", '{"model": "m", "input": "x", "metadata": {}, "temperature": %s}'),
    ("/v1/embeddings", '{"model": "m", "input": [%s]}'),
    ("/v1/rerank", '{"model": "m", "query": "q", "documents": ["d"], "top_n": %s}'),
    ("/rerank", '{"model": "m", "query": "q", "documents": ["d"], "top_n": %s}'),
    ("/v2/rerank", '{"model": "m", "query": "q", "documents": ["d"], "top_n": %s}'),
    ("/tokenize", '{"model": "m", "prompt": "x", "x": [%s]}'),
    ("/detokenize", '{"model": "m", "tokens": [%s]}'),
]
ANTHROPIC_ROUTES = [
    ("/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], '
                     '"tools": [{"name": "f", "input_schema": {"type": "object", "default": %s}}]}'),
    ("/v1/messages/count_tokens", '{"model": "m", "messages": [], "temperature": %s}'),
]

OLLAMA_ROUTES = [
    ("/api/chat", '{"model": "m", "messages": [], "options": {"temperature": %s}}'),
    ("/api/generate", '{"model": "m", "prompt": "x", "format": {"type": "number", "maximum": %s}}'),
    ("/api/embed", '{"model": "m", "input": "x", "keep_alive": %s}'),
    ("/api/embeddings", '{"model": "m", "prompt": "x", "options": {"x": [%s]}}'),
    ("/api/show", '{"model": "m", "verbose": %s}'),
]


class Untouched:
    """The processing: never reached by a body the edge refuses."""

    def __getattr__(self, name: str) -> Any:
        async def called(request: Any, caller: Caller) -> Any:
            raise AssertionError(f"{name} reached the processing")
        return called


@pytest.fixture(scope="module")
def client():
    with TestClient(build_http_app(Untouched(), [ModelCard("m")]), raise_server_exceptions=False) as c:
        yield c


def post(client, path: str, template: str, number: str):
    return client.post(path, content=(template % number).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("number", BAD_NUMBERS)
@pytest.mark.parametrize(("path", "template"), ROUTES)
def test_openai_routes_refuse_non_finite_numbers(client, path, template, number):
    for stream in ("", ', "stream": true'):
        r = post(client, path, template[:-1] + stream + "}", number)
        assert r.status_code == 400, (path, r.text)
        body = r.json()
        assert_valid("ErrorResponse", body)
        error = body["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "non_finite_number", body
        assert "not finite" in error["message"] and number[:30] in error["message"], error


@pytest.mark.parametrize("number", BAD_NUMBERS)
@pytest.mark.parametrize(("path", "template"), ANTHROPIC_ROUTES)
def test_anthropic_routes_refuse_them_in_anthropic_shape(client, path, template, number):
    r = post(client, path, template, number)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert "not finite" in body["error"]["message"]


def test_a_large_finite_number_is_read_and_validated_as_usual(client):
    template = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": %s}'
    r = post(client, "/v1/chat/completions", template, "1e308")
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text


@pytest.mark.parametrize("number", BAD_NUMBERS)
@pytest.mark.parametrize(("path", "template"), OLLAMA_ROUTES)
def test_ollama_routes_refuse_them_in_ollamas_shape(client, path, template, number):
    r = post(client, path, template, number)
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body) == {"error"} and "not finite" in body["error"], body
