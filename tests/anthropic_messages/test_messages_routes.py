"""/v1/messages and /v1/messages/count_tokens at the HTTP edge, over the real processing and the real model
(no Ray), with Anthropic's SDK and raw HTTP: bodies, events and errors valid against Anthropic's spec."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from starlette.testclient import TestClient

from app.api.errors import overloaded, payload_too_large
from app.config.app_args import Limits
from app.engine.jobs import TokenizeJob
from tests.support.engine_errors import mapped_stream
from app.http.auth import KeyChecker
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import model_cards
from app.serving.processing import Processor
from tests.support.anthropic_spec import assert_valid, assert_valid_error
from tests.support.events import wait_idle

pytestmark = pytest.mark.timeout(300)

KEY = "sk-test-m-" + "m" * 22
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class EngineModels:
    def __init__(self, engine) -> None:
        self.engine = engine

    def generate(self, model_id, gen):
        return mapped_stream(self.engine, gen, 0)

    async def run(self, model_id, job):
        if isinstance(job, TokenizeJob):
            return self.engine.tokenize(job.text, job.add_special)
        return self.engine.detokenize(job.tokens)


class Records:
    def __init__(self) -> None:
        self.records = []

    def record(self, rec) -> None:
        self.records.append(rec)


@pytest.fixture(scope="module")
def records() -> Records:
    return Records()


@pytest.fixture(scope="module")
def client(bundled_spec, engine, records):
    processor = Processor([bundled_spec], EngineModels(engine), Limits(), observer=records)
    settings = ServerSettings(keys=KeyChecker((KEY.encode(),)), max_body_bytes=64 * 1024, stream_keepalive_s=0)
    with TestClient(build_http_app(processor, model_cards([bundled_spec]), settings),
                    headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}) as c:
        yield c
        c.portal.call(wait_idle, engine)


@pytest.fixture(scope="module")
def sdk(client):
    return anthropic.Anthropic(base_url=str(client.base_url), api_key=KEY, http_client=client, max_retries=0)


def ask(spec, **fields) -> dict[str, Any]:
    return {"model": spec.id, "max_tokens": 12, "temperature": 0, "cache_prompt": False,
            "messages": [{"role": "user", "content": "Name three colours."}], **fields}


def events_of(text: str) -> list[dict[str, Any]]:
    """The stream's events, checking that each `event:` line names its data's type."""
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        out.append(data)
    return out


def test_create_and_count_tokens(client, sdk, bundled_spec):
    r = client.post("/v1/messages", json=ask(bundled_spec), headers={"anthropic-beta": "anything-2025"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert_valid("Message", body)
    assert body["content"][0]["type"] == "text" and body["content"][0]["text"]
    assert body["stop_reason"] in ("end_turn", "max_tokens") and body["usage"]["output_tokens"] <= 12
    count = client.post("/v1/messages/count_tokens",
                        json={"model": bundled_spec.id, "messages": ask(bundled_spec)["messages"]})
    assert count.status_code == 200 and count.json().keys() == {"input_tokens"}
    assert_valid("CountMessageTokensResponse", count.json())
    assert count.json()["input_tokens"] == body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"]
    assert sdk.messages.count_tokens(model=bundled_spec.id, messages=ask(bundled_spec)["messages"]).input_tokens == \
        count.json()["input_tokens"]


def test_stream_equals_the_whole_reply(client, bundled_spec):
    whole = client.post("/v1/messages", json=ask(bundled_spec)).json()
    r = client.post("/v1/messages", json=ask(bundled_spec, stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = events_of(r.text)
    for event in events:
        assert_valid("MessageStreamEvent", event)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == whole["content"][0]["text"]
    assert events[-2]["delta"]["stop_reason"] == whole["stop_reason"]
    assert events[-2]["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_stop_sequence_is_reported(client, bundled_spec):
    free = client.post("/v1/messages", json=ask(bundled_spec, max_tokens=12)).json()["content"][0]["text"]
    word = free.split()[2]  # a word the greedy reply does write
    body = client.post("/v1/messages", json=ask(bundled_spec, max_tokens=12, stop_sequences=["zzz", word])).json()
    assert_valid("Message", body)
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", word)
    assert word not in body["content"][0]["text"] and free.startswith(body["content"][0]["text"])


def test_forced_tool_call_round_trip_with_the_sdk(sdk, bundled_spec):
    first = sdk.messages.create(model=bundled_spec.id, max_tokens=60, extra_body={"temperature": 0}, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert_valid("Message", first.model_dump(mode="json"))
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and call.name == "get_weather" and isinstance(call.input["city"], str)
    second = sdk.messages.create(model=bundled_spec.id, max_tokens=20, extra_body={"temperature": 0}, tools=[TOOL],
                                 messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}]}])
    assert second.content and second.content[0].type == "text" and second.stop_reason in ("end_turn", "max_tokens")


def test_sdk_stream_helper(sdk, bundled_spec):
    with sdk.messages.stream(model=bundled_spec.id, max_tokens=10, extra_body={"temperature": 0},
                             messages=[{"role": "user", "content": "Hello"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens >= 1


def test_requests_are_recorded_as_messages(client, bundled_spec, records):
    records.records.clear()
    client.post("/v1/messages", json=ask(bundled_spec, max_tokens=2))
    client.post("/v1/messages", json=ask(bundled_spec, max_tokens=2, stream=True))
    assert [(r.protocol, r.stream, r.status) for r in records.records] == [("messages", False, "ok"),
                                                                           ("messages", True, "ok")]


# ---- errors, in Anthropic's shape --------------------------------------------------------------

def error_of(r, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    assert_valid_error(r.json())
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind
    return r.json()["error"]["message"]


def test_client_errors(client, bundled_spec):
    body = ask(bundled_spec)
    del body["max_tokens"]
    assert "max_tokens" in error_of(client.post("/v1/messages", json=body), 400, "invalid_request_error")
    assert error_of(client.post("/v1/messages", json=ask(bundled_spec, model="nope")), 404, "not_found_error")
    assert error_of(client.post("/v1/messages/count_tokens", json={"model": "nope", "messages": body["messages"]}),
                    404, "not_found_error")
    error_of(client.post("/v1/messages", content=b"{" + b" " * 70_000 + b"}"), 413, "request_too_large")
    error_of(client.post("/v1/messages", content=b"{nope"), 400, "invalid_request_error")
    error_of(client.get("/v1/messages"), 405, "invalid_request_error")
    long = ask(bundled_spec, messages=[{"role": "user", "content": "word " * 1500}])
    assert "context length" in error_of(client.post("/v1/messages", json=long), 400, "invalid_request_error")


def test_keys(client, bundled_spec):
    for headers in ({"x-api-key": "wrong"}, {"x-api-key": ""}):
        r = client.post("/v1/messages", json=ask(bundled_spec), headers=headers)
        error_of(r, 401, "authentication_error")
        r = client.post("/v1/messages/count_tokens", json={"model": bundled_spec.id, "messages": []}, headers=headers)
        error_of(r, 401, "authentication_error")
    r = client.post("/v1/messages", json=ask(bundled_spec, max_tokens=1),
                    headers={"x-api-key": "", "authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    r = client.post("/v1/chat/completions", json={}, headers={"x-api-key": "wrong"})  # other routes keep OpenAI's
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


class Failing:
    """Processing that refuses every request with `error`, or fails a stream after its first event."""

    def __init__(self, error: BaseException, after_first: bool = False) -> None:
        self.error, self.after_first = error, after_first

    async def respond(self, request, caller):
        raise self.error

    async def stream(self, request, caller):
        if not self.after_first:
            raise self.error
        yield []
        yield [{"type": "message_start", "message": {}}]
        raise self.error


def failing_client(processing, bundled_spec) -> TestClient:
    return TestClient(build_http_app(processing, model_cards([bundled_spec])))


def test_overloaded_is_529_and_the_sdk_reads_it(bundled_spec):
    with failing_client(Failing(overloaded()), bundled_spec) as c:
        for stream in (False, True):
            r = c.post("/v1/messages", json=ask(bundled_spec, stream=stream))
            error_of(r, 529, "overloaded_error")
            assert r.headers["retry-after"] == "1"
        sdk = anthropic.Anthropic(base_url=str(c.base_url), api_key="k", http_client=c, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as info:
            sdk.messages.create(model=bundled_spec.id, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 529 and type(info.value).__name__ == "OverloadedError"


def test_an_error_mid_stream_is_an_error_event(bundled_spec):
    with failing_client(Failing(payload_too_large(1), after_first=True), bundled_spec) as c:
        r = c.post("/v1/messages", json=ask(bundled_spec, stream=True))
    assert r.status_code == 200
    events = events_of(r.text)
    assert [e["type"] for e in events] == ["message_start", "error"]
    assert_valid_error(events[-1])
    with failing_client(Failing(RuntimeError("secret detail"), after_first=True), bundled_spec) as c:
        r = c.post("/v1/messages", json=ask(bundled_spec, stream=True))
    error = events_of(r.text)[-1]
    assert_valid_error(error)
    assert error["error"]["type"] == "api_error" and "secret" not in r.text
