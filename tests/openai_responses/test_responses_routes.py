"""The Responses routes over a fake processing: typed-event framing, the `error` event that ends a stream
numbered after the last event sent, OpenAI's error shape for refused requests, and input token counts."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from app.api.errors import invalid_request
from app.http.app import build_http_app
from app.http.model_cards import ModelCard
from app.openai_responses.schemas import InputTokensRequest, ResponsesRequest
from app.generation.caller import Caller
from tests.support.responses_events import assert_valid_event


class Processing:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def respond(self, request: Any, caller: Caller) -> dict[str, Any]:
        self.requests.append(request)
        assert isinstance(request, InputTokensRequest)
        return {"object": "response.input_tokens", "input_tokens": 5}

    async def stream(self, request: ResponsesRequest, caller: Caller):
        self.requests.append(request)
        yield []
        yield [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                "delta": "Hi", "logprobs": [], "sequence_number": n} for n in range(3)]
        raise invalid_request("The model went away.", param="input", code="gone")


def client() -> tuple[TestClient, Processing]:
    processing = Processing()
    return TestClient(build_http_app(processing, [ModelCard("m")])), processing


def test_a_failure_mid_stream_is_the_next_numbered_error_event():
    http, _ = client()
    r = http.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in r.text.split("\n\n") if b]
    assert "[DONE]" not in r.text
    names = [b.split("\n")[0] for b in blocks]
    assert names == ["event: response.output_text.delta"] * 3 + ["event: error"]
    error = json.loads(blocks[-1].split("\n", 1)[1].removeprefix("data: "))
    assert error == {"type": "error", "code": "gone", "message": "The model went away.", "param": "input",
                     "sequence_number": 3}
    assert_valid_event(error)


def test_refused_requests_are_openai_errors_naming_the_field():
    http, processing = client()
    for body, param in (({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
                        ({"background": True}, "background"), ({"nope": 1}, "nope")):
        r = http.post("/v1/responses", json={"model": "m", "input": "hi", **body})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post("/v1/responses", json={"model": "other", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert processing.requests == []


def test_input_tokens_route():
    http, processing = client()
    r = http.post("/v1/responses/input_tokens", json={"model": "m", "input": "hi", "instructions": "x"})
    assert r.json() == {"object": "response.input_tokens", "input_tokens": 5}
    assert processing.requests[0].instructions == "x"
    r = http.post("/v1/responses/input_tokens", json={"model": "m", "input": "hi", "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_echoed_fields_that_never_reach_the_prompt_are_bounded():
    """`user`, `metadata` and `text.format`'s name and description are echoed and stored, never part of the
    prompt: bounded as OpenAI bounds them (metadata, the format's name) or by a length of ours."""
    http, processing = client()
    schema = {"type": "string"}
    for fields, param in (({"user": "u" * 257}, "user"),
                          ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
                          ({"metadata": {"k" * 65: "v"}}, "metadata"),
                          ({"metadata": {"k": "v" * 513}}, "metadata"),
                          ({"text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": schema}}},
                           "text.format.name"),
                          ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": schema}}},
                           "text.format.name"),
                          ({"text": {"format": {"type": "json_schema", "name": "n", "schema": schema,
                                                "description": "d" * 4097}}}, "text.format.description")):
        r = http.post("/v1/responses", json={"model": "m", "input": "hi", **fields})
        assert r.status_code == 400, (param, r.text)
        assert r.json()["error"]["param"] == param, r.json()
    assert processing.requests == []
    at_bounds = {"user": "u" * 256, "metadata": {f"k{i:062d}": "v" * 512 for i in range(16)},
                 "text": {"format": {"type": "json_schema", "name": "N_-9" * 16, "schema": schema,
                                     "description": "d" * 4096}}}
    # The same request schema, answered by this fake processing.
    r = http.post("/v1/responses/input_tokens", json={"model": "m", "input": "hi", **at_bounds})
    assert r.status_code == 200, r.text
