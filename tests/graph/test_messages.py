"""Anthropic's Messages API end to end through a real local Ray Serve (both topologies) and the real model,
with Anthropic's official SDK and raw httpx; every body and event validated against Anthropic's spec."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.anthropic_spec import assert_valid, assert_valid_error
from tests.support.serve_harness import EMBED_MODEL, KEY_A, MODEL, RERANK_MODEL, REPRODUCIBLE

pytestmark = pytest.mark.timeout(600)

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = [{"role": "user", "content": "Tell me about the moon."}]


@pytest.fixture
def sdk(cluster):
    return anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120)


@pytest.fixture
def raw(cluster):
    """httpx as Anthropic's clients call: `x-api-key` and `anthropic-version`, no Authorization header."""
    with httpx.Client(base_url=cluster.url, timeout=120,
                      headers={"x-api-key": KEY_A, "anthropic-version": "2023-06-01"}) as c:
        yield c


def body(**fields: Any) -> dict[str, Any]:
    # Greedy, and no cached prefix reused: the same request gives the same reply (docs/api.md, Determinism).
    return {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": QUESTION, **REPRODUCIBLE, **fields}


def stream_events(text: str) -> list[dict[str, Any]]:
    """Each SSE frame's data, its `event:` line naming its type; pings (Anthropic's keep-alive) skipped."""
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], frame
        if data["type"] != "ping":
            out.append(data)
    return out


def test_create(sdk):
    msg = sdk.messages.create(model=MODEL, max_tokens=16, messages=QUESTION, extra_body={"temperature": 0})
    assert_valid("Message", msg.model_dump(mode="json"))
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.content[0].type == "text" and msg.content[0].text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and 1 <= msg.usage.output_tokens <= 16
    assert msg.id.startswith("msg_")


def test_stream_events_in_order_and_equal_to_the_whole_reply(raw):
    whole = raw.post("/v1/messages", json=body())
    assert whole.status_code == 200, whole.text
    assert_valid("Message", whole.json())
    r = raw.post("/v1/messages", json=body(stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = stream_events(r.text)
    for event in events:
        assert_valid("MessageStreamEvent", event)
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop" and types[-2] == "message_delta"
    blocks = [e for e in events if e["type"].startswith("content_block")]
    assert [e["index"] for e in blocks] == [0] * len(blocks)
    assert blocks[0]["type"] == "content_block_start" and blocks[-1]["type"] == "content_block_stop"
    text = "".join(e["delta"]["text"] for e in blocks if e["type"] == "content_block_delta")
    assert text == whole.json()["content"][0]["text"]
    assert events[-2]["delta"]["stop_reason"] == whole.json()["stop_reason"]
    assert events[-2]["usage"]["output_tokens"] == whole.json()["usage"]["output_tokens"]


def test_sdk_stream_helper(sdk):
    with sdk.messages.stream(model=MODEL, max_tokens=16, messages=QUESTION,
                             extra_body={"temperature": 0, **REPRODUCIBLE}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = sdk.messages.create(model=MODEL, max_tokens=16, messages=QUESTION,
                                extra_body={"temperature": 0, **REPRODUCIBLE})
    assert text and final.content[0].text == text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_tool_use_round_trip(sdk):
    first = sdk.messages.create(model=MODEL, max_tokens=60, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"}],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    assert_valid("Message", first.model_dump(mode="json"))
    calls = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and isinstance(call.input["city"], str) and call.id.startswith("toolu_")
    second = sdk.messages.create(model=MODEL, max_tokens=24, tools=[WEATHER], extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": "What is the weather in Paris?"},
                                           {"role": "assistant", "content": first.content},
                                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                                         "content": "18 C and sunny"}]}])
    assert_valid("Message", second.model_dump(mode="json"))
    assert second.content and second.content[0].type == "text" and second.content[0].text.strip()
    assert second.stop_reason in ("end_turn", "max_tokens")


def test_streamed_tool_use_input_arrives_in_fragments(raw):
    r = raw.post("/v1/messages", json=body(max_tokens=60, stream=True, tools=[WEATHER], tool_choice={"type": "any"},
                                           messages=[{"role": "user", "content": "Weather in Oslo?"}]))
    events = stream_events(r.text)
    for event in events:
        assert_valid("MessageStreamEvent", event)
    start = next(e for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use")
    fragments = [e["delta"]["partial_json"] for e in events
                 if e["type"] == "content_block_delta" and e["index"] == start["index"]]
    assert len(fragments) > 1 and isinstance(json.loads("".join(fragments))["city"], str)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_equals_the_requests_input(sdk, raw):
    system, tools = "You are terse.", [WEATHER]
    count = sdk.messages.count_tokens(model=MODEL, system=system, tools=tools, messages=QUESTION)
    r = raw.post("/v1/messages/count_tokens", json={"model": MODEL, "system": system, "tools": tools,
                                                    "messages": QUESTION})
    assert r.status_code == 200 and r.json() == {"input_tokens": count.input_tokens}
    assert_valid("CountMessageTokensResponse", r.json())
    msg = raw.post("/v1/messages", json=body(max_tokens=2, system=system, tools=tools)).json()
    assert msg["usage"]["cache_read_input_tokens"] == 0  # cache_prompt: false, so input_tokens is the whole prompt
    assert count.input_tokens == msg["usage"]["input_tokens"] > 0


def test_errors_in_anthropic_shape(sdk, cluster, raw):
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(model=MODEL, messages=QUESTION, max_tokens=16, extra_body={"max_tokens": None})
    assert info.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in info.value.message
    r = raw.post("/v1/messages", json={"model": MODEL, "messages": QUESTION})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    assert_valid_error(r.json())

    bad = anthropic.Anthropic(base_url=cluster.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert info.value.status_code == 401 and info.value.body["error"]["type"] == "authentication_error"
    assert_valid_error(info.value.response.json())

    with pytest.raises(anthropic.NotFoundError) as info:
        sdk.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "not_found_error"
    assert_valid_error(info.value.response.json())

    r = raw.post("/v1/messages", json=body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]))
    assert r.status_code == 400 and "messages.0.content.0.type" in r.json()["error"]["message"]
    assert_valid_error(r.json())
    # An image that is not one: refused by the image reader, in Anthropic's shape too.
    r = raw.post("/v1/messages", json=body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]))
    assert r.status_code == 400 and "not an image" in r.json()["error"]["message"], r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert_valid_error(r.json())


@pytest.mark.parametrize("model", [EMBED_MODEL, RERANK_MODEL])
def test_every_chat_route_refuses_a_model_of_another_kind_alike(raw, model):
    """Counting a prompt for a model that has no chat template is the same 400 as generating with it
    (it once counted an empty template and answered 200)."""
    messages = {"model": model, "messages": QUESTION}
    for path, extra in [("/v1/messages", {"max_tokens": 4}), ("/v1/messages/count_tokens", {}),
                        ("/v1/chat/completions", {}), ("/v1/responses", {"input": "Hi"}),
                        ("/v1/responses/input_tokens", {"input": "Hi"})]:
        req = {**messages, **extra}
        if path.startswith("/v1/responses"):
            req.pop("messages")
        r = raw.post(path, json=req)
        assert r.status_code == 400, (path, r.status_code, r.text)
        error = r.json()["error"]
        assert error.get("code", "unsupported_model") == "unsupported_model", (path, error)
        assert f"Model `{model}` is a" in error["message"] and "it serves /v1/" in error["message"], (path, error)
        if path.startswith("/v1/messages"):
            assert_valid_error(r.json())
