"""The Messages service over model events (no engine): the core's real reply events (parsers, reasoning split,
tool-call arguments in fragments) turned into Anthropic's stream events, each valid against Anthropic's spec,
in order, and read by Anthropic's own SDK into the very message the unstreamed reply is."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event

from app.anthropic_messages import MessagesService
from app.anthropic_messages.events import MessageEvents
from app.anthropic_messages.schemas import parse_messages_request
from app.anthropic_messages.shaping import Totals
from app.engine.events import Finished, Started, Text
from app.generation.reading import Closed, Delta, Opened
from tests.support.anthropic_spec import assert_valid

WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                    "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def service(spec, parts: list[str], finish: str = "stop", *, prompt: int = 40, cached: int = 0,
            stop_sequence: str | None = None) -> MessagesService:
    async def open_stream(model_id, gen):
        yield [Started(prompt_tokens=prompt, cached_tokens=cached)]
        for part in parts:  # one batch each: the parsers see every fragment as it comes
            yield [Text(part, 1)]
        yield [Finished(finish, prompt, len(parts), cached, stop_sequence=stop_sequence)]
    return MessagesService([spec], open_stream)


def ask(spec, **fields):
    return parse_messages_request({"model": spec.id, "max_tokens": 64,
                                   "messages": [{"role": "user", "content": "Weather in Paris?"}], **fields})


async def _events(svc, req) -> list[dict[str, Any]]:
    stream = svc.stream(req)
    assert await anext(stream) == []  # accepted
    return [event async for batch in stream for event in batch]


def run_both(svc, spec, **fields) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body = asyncio.run(svc.complete(ask(spec, **fields)))
    events = asyncio.run(_events(svc, ask(spec, stream=True, **fields)))
    return body, events


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each event valid, in Anthropic's order; the message the SDK accumulates from them."""
    for event in events:
        assert_valid("MessageStreamEvent", event)
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types.count("message_start") == types.count("message_delta") == types.count("message_stop") == 1
    open_index, next_index = None, 0
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == next_index
            open_index, next_index = event["index"], next_index + 1
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
        else:
            assert event["type"] == "content_block_stop" and event["index"] == open_index
            open_index = None
    assert open_index is None, "every block is closed before message_delta"
    snapshot, bufs = None, {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot.model_dump(mode="json", exclude_none=False)


def same_message(streamed: dict[str, Any], body: dict[str, Any]) -> None:
    assert_valid("Message", body)
    keys = ("type", "role", "model", "stop_reason", "stop_sequence")
    assert {k: streamed[k] for k in keys} == {k: body[k] for k in keys}
    assert streamed["usage"]["output_tokens"] == body["usage"]["output_tokens"]
    assert streamed["usage"]["input_tokens"] == body["usage"]["input_tokens"]
    assert streamed["usage"]["cache_read_input_tokens"] == body["usage"]["cache_read_input_tokens"]
    fields = ("type", "text", "thinking", "name", "input")
    got = [{k: v for k, v in b.items() if k in fields} for b in streamed["content"]]
    want = [{k: v for k, v in b.items() if k in fields} for b in body["content"]]
    assert got == want
    assert all(b["id"].startswith("toolu_") for b in body["content"] if b["type"] == "tool_use")


@pytest.mark.parametrize("size", [1, 3, 50])
def test_text_stream(bundled_spec, size):
    text = "Hello there, friend. It is sunny."
    body, events = run_both(service(bundled_spec, pieces(text, size), prompt=40, cached=12), bundled_spec)
    streamed = check_stream(events)
    same_message(streamed, body)
    assert body["content"] == [{"type": "text", "text": text, "citations": None}]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert body["usage"]["input_tokens"] == 28 and body["usage"]["cache_read_input_tokens"] == 12
    assert events[0]["message"]["usage"]["output_tokens"] == 0
    assert events[-2]["usage"]["output_tokens"] == len(pieces(text, size))


@pytest.mark.parametrize("size", [1, 4, 9, 200])
def test_tool_call_arguments_stream_as_input_json_deltas(bundled_spec, size):
    text = "Let me check. " + CALL
    svc = service(bundled_spec, pieces(text, size))
    body, events = run_both(svc, bundled_spec, tools=[WEATHER])
    streamed = check_stream(events)
    same_message(streamed, body)
    assert [b["type"] for b in body["content"]] == ["text", "tool_use"]
    assert body["content"][1]["input"] == {"city": "Paris", "unit": "C"} and body["stop_reason"] == "tool_use"
    start = next(e for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use")
    assert start["content_block"]["input"] == {} and start["content_block"]["name"] == "get_weather"
    fragments = [e["delta"]["partial_json"] for e in events
                 if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    assert json.loads("".join(fragments)) == {"city": "Paris", "unit": "C"}
    if size < 10:
        assert len(fragments) > 1, "arguments go out as they are generated, not at the end"


def test_parallel_calls_are_blocks_of_their_own(bundled_spec):
    second = CALL.replace("Paris", "Lyon")
    body, events = run_both(service(bundled_spec, pieces(CALL + "\n" + second, 5)), bundled_spec, tools=[WEATHER])
    same_message(check_stream(events), body)
    assert [b["input"]["city"] for b in body["content"]] == ["Paris", "Lyon"]
    assert len({b["id"] for b in body["content"]}) == 2
    body, events = run_both(service(bundled_spec, pieces(CALL + "\n" + second, 5)), bundled_spec, tools=[WEATHER],
                            tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    same_message(check_stream(events), body)
    assert [b["input"]["city"] for b in body["content"]] == ["Paris"]


@pytest.mark.parametrize("size", [1, 6, 100])
def test_thinking_then_text(bundled_spec, size):
    spec = replace(bundled_spec, reasoning_parser="think")
    body, events = run_both(service(spec, pieces("<think>sun is up</think>It is sunny.", size)), spec)
    same_message(check_stream(events), body)
    assert body["content"] == [{"type": "thinking", "thinking": "sun is up", "signature": ""},
                               {"type": "text", "text": "It is sunny.", "citations": None}]
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"][0] == "thinking_delta"


@pytest.mark.parametrize("finish, stop_sequence, reason", [
    ("stop", "END", "stop_sequence"), ("length", None, "max_tokens"), ("stop", None, "end_turn")])
def test_stop_reasons(bundled_spec, finish, stop_sequence, reason):
    svc = service(bundled_spec, ["Some text"], finish, stop_sequence=stop_sequence)
    body, events = run_both(svc, bundled_spec, stop_sequences=["END"])
    same_message(check_stream(events), body)
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, stop_sequence)
    assert events[-2]["delta"]["stop_reason"] == reason and events[-2]["delta"]["stop_sequence"] == stop_sequence


def test_empty_reply_is_a_message_without_blocks(bundled_spec):
    body, events = run_both(service(bundled_spec, []), bundled_spec)
    same_message(check_stream(events), body)
    assert body["content"] == [] and [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


def test_state_machine_on_reply_events_directly():
    """Reply events as the core makes them: opening the reply opens no block; a change of kind closes the open
    block."""
    machine = MessageEvents("msg_1", "m", lambda: Totals(prompt_tokens=5, completion_tokens=3))

    def delta(delta: dict[str, Any]) -> Delta:
        return Delta(0, delta, None)

    events = [*machine.feed(Opened(0)),
              *machine.feed(delta({"reasoning_content": "hm"})),
              *machine.feed(delta({"content": "Hi"})),
              *machine.feed(delta({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                                                   "function": {"name": "f", "arguments": ""}}]})),
              *machine.feed(delta({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]})),
              *machine.feed(delta({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]})),
              *machine.feed(Closed(0, "tool_calls", None)),
              *machine.feed(Closed(0, "tool_calls", None))]  # a second close changes nothing
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2),
        ("content_block_stop", 2), ("message_delta", None), ("message_stop", None)]
    assert events[7]["content_block"]["id"] == "toolu_abc"
    message = check_stream(events)
    assert message["content"][2]["input"] == {"a": 1} and message["stop_reason"] == "tool_use"
