"""The event state machine and the response shaper, fed with the reply events the generation core's own
parsers make from model text split into small pieces: every event and body valid against OpenAI's spec, numbered
in order, and the streamed response equal to the one shaped from the whole reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.generation.reading import Closed, Delta, Opened, ReplyEvent, finish_reason
from app.openai_responses.events import ResponseEvents
from app.openai_responses.schemas import parse_responses_request
from app.openai_responses.shaping import ResponseShaper, output_items, usage
from app.parsers import ReplyParser
from tests.support.openapi_spec import assert_valid
from tests.support.responses_events import assert_valid_event

USAGE = {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50, "prompt_tokens_details": {"cached_tokens": 7},
         "completion_tokens_details": {"reasoning_tokens": 6}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


def reply_stream(text: str, piece: int, ended: str = "stop") -> tuple[list[ReplyEvent], dict[str, Any]]:
    """The reply events a reply of `text` streams (pieces of `piece` characters), and its parsed whole message."""
    def parser() -> ReplyParser:
        return ReplyParser(reasoning="think", tools="hermes", tool_names=frozenset({"get_weather", "get_time"}))

    stream = parser()
    events: list[ReplyEvent] = [Opened(0)]
    for i in range(0, len(text), piece):
        events += [Delta(0, d, None) for d in stream.feed(text[i:i + piece])]
    events += [Delta(0, d, None) for d in stream.finish()]
    events.append(Closed(0, finish_reason(stream.made_tool_calls, ended), None))
    return events, parser().parse(text)


def run(text: str, piece: int, ended: str = "stop", **fields: Any):
    req = parse_responses_request({"model": "m", "input": "hi", "stream": True, **fields})
    machine = ResponseEvents(ResponseShaper(req), lambda: USAGE)
    replies, message = reply_stream(text, piece, ended)
    events = [e for reply in replies for e in machine.feed(reply)]
    whole = ResponseShaper(req).finished(output_items(message, ended == "length"), USAGE, ended)
    return events, machine.final, whole


def checked(events: list[dict[str, Any]]) -> list[str]:
    for event in events:
        assert_valid_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert sum(k in ("response.completed", "response.incomplete") for k in kinds) == 1
    assert kinds[-1] in ("response.completed", "response.incomplete")
    return kinds


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at")}
    out["output"] = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in response["output"]]
    return out


def items_events(kinds: list[str]) -> list[str]:
    return [k.removeprefix("response.") for k in kinds if k.startswith("response.") and
            k not in ("response.created", "response.in_progress", "response.completed", "response.incomplete")
            and not k.endswith(".delta")]


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_reasoning_then_text(piece):
    events, final, whole = run("<think>Short thought.</think>The answer is 4.", piece)
    kinds = checked(events)
    assert items_events(kinds) == [
        "output_item.added", "content_part.added", "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.done", "content_part.done", "output_item.done"]
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert reasoning == "Short thought." and text == "The answer is 4."
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "Short thought."}]
    assert_valid("Response", final)
    assert without_ids(final) == without_ids(whole)
    assert final["status"] == "completed" and final["output_text"] == "The answer is 4."
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 7
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 6  # the engine's count, as it is
    # an item as it was when added: nothing written yet
    assert [e["item"]["content"] for e in events if e["type"] == "response.output_item.added"] == [[], []]
    # each delta and done names its item and place
    ids = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    for e in events:
        if "item_id" in e:
            assert e["item_id"] == ids[e["output_index"]]


@pytest.mark.parametrize("piece", [1, 3, 5, 1000])
def test_call_arguments_stream_in_fragments(piece):
    events, final, whole = run("Let me check.\n" + CALL + "\n" + CALL.replace("get_weather", "get_time"), piece)
    kinds = checked(events)
    assert items_events(kinds).count("function_call_arguments.done") == 2
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    for call in calls:
        deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
                  and e["item_id"] == call["id"]]
        assert "".join(deltas) == call["arguments"]
        assert json.loads(call["arguments"]) == {"city": "Paris", "days": 3}
        if piece < 5:
            assert len(deltas) > 1  # as generated, not at the end
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[1]["type"] == "function_call" and added[1]["arguments"] == "" and added[1]["status"] == "in_progress"
    assert final["output"][0]["content"][0]["text"].strip() == "Let me check."
    assert_valid("Response", final)
    assert without_ids(final) == without_ids(whole)


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_a_cut_by_max_tokens_is_incomplete(piece):
    events, final, whole = run("<think>Thinking about it</think>The answer is", piece, ended="length",
                               max_output_tokens=20)
    kinds = checked(events)
    assert kinds[-1] == "response.incomplete"
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["completed_at"] is None
    assert [i["status"] for i in final["output"]] == ["completed", "incomplete"]
    assert_valid("Response", final)
    assert without_ids(final) == without_ids(whole)


def test_a_call_cut_mid_arguments_keeps_what_was_generated():
    events, final, _ = run(CALL[:50], 3, ended="length")
    checked(events)
    (call,) = final["output"]
    assert call["type"] == "function_call" and call["status"] == "incomplete"
    assert call["arguments"] == "".join(e["delta"] for e in events if e["type"] ==
                                        "response.function_call_arguments.delta")


def test_an_empty_reply_is_one_empty_message_as_the_whole_body_has():
    events, final, whole = run("", 1)
    checked(events)
    assert [i["type"] for i in final["output"]] == ["message"] and final["output_text"] == ""
    assert without_ids(final) == without_ids(whole)


def test_echoed_parameters():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    req = parse_responses_request({"model": "m", "input": "x", "instructions": "I", "tools": [tool],
                                   "tool_choice": {"type": "function", "name": "f"}, "temperature": 0.5, "top_p": 0.9,
                                   "max_output_tokens": 9, "parallel_tool_calls": False, "metadata": {"a": "b"},
                                   "store": False, "user": "u", "reasoning": {"effort": "high"},
                                   "previous_response_id": "resp_1",
                                   "text": {"format": {"type": "json_schema", "name": "n", "schema": {}, "strict": True}}})
    body = ResponseShaper(req).finished([], USAGE, "stop")
    assert_valid("Response", body)
    assert {k: body[k] for k in ("model", "instructions", "temperature", "top_p", "max_output_tokens",
                                 "parallel_tool_calls", "metadata", "store", "user", "previous_response_id",
                                 "truncation")} == {
        "model": "m", "instructions": "I", "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 9,
        "parallel_tool_calls": False, "metadata": {"a": "b"}, "store": False, "user": "u",
        "previous_response_id": "resp_1", "truncation": "disabled"}
    assert body["tools"] == [{**tool, "description": None}]
    assert body["tool_choice"] == {"type": "function", "name": "f"}
    assert body["text"] == {"format": {"type": "json_schema", "name": "n", "schema": {}, "strict": True}}
    assert body["reasoning"] == {"effort": "high", "summary": None}


def test_usage_names_and_the_engines_reasoning_count():
    assert usage(USAGE) == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 7, "cache_write_tokens": 0},
                            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 6},
                            "total_tokens": 50}
