"""Reasoning split and tool calls end to end: real graph, real model steered by grammars,
the openai SDK; every body validated against OpenAI's spec."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import MODEL, REPRODUCIBLE, THINK_MODEL, sse_json

pytestmark = pytest.mark.timeout(600)

THINK_GRAMMAR = 'root ::= "<think>" [a-z ]{1,40} "</think>" [a-z ]{1,40}'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---- reasoning --------------------------------------------------------------------------------

def test_forced_think_reply_is_split(client, http):
    raw = client.chat.completions.with_raw_response.create(
        model=THINK_MODEL, messages=ASK, max_tokens=60, seed=5, extra_body={"grammar": THINK_GRAMMAR, **REPRODUCIBLE})
    body = raw.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    msg = body["choices"][0]["message"]
    assert re.fullmatch(r"[a-z ]{1,40}", msg["reasoning_content"].strip() or "x"), msg
    assert msg["reasoning_content"] and msg["content"]
    for field in (msg["reasoning_content"], msg["content"]):
        assert "<think" not in field and "</think" not in field and "think>" not in field

    r = http.post("/v1/chat/completions", json={"model": THINK_MODEL, "messages": ASK, "max_tokens": 60,
                                                 "seed": 5, "grammar": THINK_GRAMMAR, "stream": True, **REPRODUCIBLE})
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning == msg["reasoning_content"] and content == msg["content"]
    # reasoning comes first, then content; no tag fragment in any single delta
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")
    assert not any("<" in (d.get("reasoning_content") or "") + (d.get("content") or "") for d in deltas)


def test_include_reasoning_false_drops_it(client):
    r = client.chat.completions.create(model=THINK_MODEL, messages=ASK, max_tokens=60, seed=5,
                                       extra_body={"grammar": THINK_GRAMMAR, "include_reasoning": False})
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.choices[0].message.content and "think" not in r.choices[0].message.content


def test_unclosed_reasoning_still_answers(client):
    r = client.chat.completions.create(model=THINK_MODEL, messages=ASK, max_tokens=60, seed=5,
                                       extra_body={"grammar": 'root ::= "<think>" [a-z ]{5,30}'})
    msg = r.choices[0].message
    assert msg.content and msg.content == msg.reasoning_content  # never an empty answer


# ---- tool calls -------------------------------------------------------------------------------

def _check_calls(calls, allowed: set[str]):
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# A named function's forced call (the same grammar path as `required`, one name) in make test-slow: each case is
# three generations in each topology.
@pytest.mark.parametrize("choice,allowed", [
    ("required", {"get_weather", "add"}),
    pytest.param({"type": "function", "function": {"name": "add"}}, {"add"}, marks=pytest.mark.slow),
])
def test_forced_tool_calls_non_streaming_and_streaming(client, http, choice, allowed):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice=choice, max_tokens=80, seed=11,
              extra_body=REPRODUCIBLE)
    raw = client.chat.completions.with_raw_response.create(**kw)
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    r = raw.parse()
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message.tool_calls, allowed)

    # The SDK's stream helper accumulates exactly the calls the non-streaming path returned.
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    streamed = [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]
    assert streamed == [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]

    # Raw chunks: first delta of a call has id/type/name, later ones only argument fragments.
    body = {**{k: v for k, v in kw.items() if k != "extra_body"}, **REPRODUCIBLE, "stream": True}
    chunks, events = sse_json(http.post("/v1/chat/completions", json=body).text)
    assert events.count("[DONE]") == 1
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function" and calls[0]["function"]["name"]
    assert all(set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"} for tc in calls[1:])
    assert "".join(tc["function"].get("arguments", "") for tc in calls) == r.choices[0].message.tool_calls[0].function.arguments


def test_long_arguments_stream_in_fragments(client):
    # A string of 60+ chars is many tokens: its call's arguments reach the SDK in several chunks, and
    # they add up to the non-streamed reply's arguments for the same request (both reproducible: no
    # cached prefix reused, so both decode the prompt alike).
    note = {"type": "function", "function": {"name": "save_note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 60, "maxLength": 100}},
        "required": ["text"], "additionalProperties": False}}}
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Save a note about the weather in Paris."}],
          "tools": [note], "tool_choice": "required", "max_tokens": 160, "seed": 7, "temperature": 0,
          "extra_body": REPRODUCIBLE}
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert whole.function.name == "save_note" and len(json.loads(whole.function.arguments)["text"]) >= 60
    heads, fragments = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert tc.index == 0
            if tc.id:
                heads.append((tc.id, tc.function.name, tc.function.arguments))
            elif tc.function.arguments:
                fragments.append(tc.function.arguments)
    assert len(heads) == 1 and heads[0][1:] == ("save_note", "") and heads[0][0].startswith("call_")
    assert len(fragments) > 1, fragments
    assert len(json.loads("".join(fragments))["text"]) >= 60
    assert "".join(fragments) == whole.function.arguments


def test_call_cut_by_max_tokens_is_continued(client):
    # 10 tokens end inside the call's JSON: the reply goes on in continuation rounds until the call is whole.
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=10, seed=11)
    cut = client.chat.completions.create(**kw)
    assert cut.choices[0].finish_reason == "tool_calls"
    _check_calls(cut.choices[0].message.tool_calls, {"get_weather"})
    assert cut.usage.completion_tokens > 10  # the real count over the continuation rounds
    with client.chat.completions.stream(**kw) as stream:  # streamed too: one call, its fragments whole JSON
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    _check_calls(final.choices[0].message.tool_calls, {"get_weather"})


def test_tools_offered_but_no_call_is_plain_content(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=16, seed=2)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8, seed=2)
    assert not r.choices[0].message.tool_calls


def test_agent_round_trip(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=80, seed=3)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=24, seed=3)
    assert second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered


# ---- response_format --------------------------------------------------------------------------

def test_json_schema_response_format(client):
    # Bounded, so every reply the grammar allows ends within max_tokens (at most ~390 characters with every
    # character \u-escaped, and each token is at least one): a sampled reply must stop, whatever the draw.
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                                "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                         "maxItems": 3}},
              "required": ["name", "age", "tags"], "additionalProperties": False}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=400, seed=4,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    r = raw.parse()
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, seed=4,
                                       response_format={"type": "json_object"})
    # Any JSON object is unbounded: one that stops is whole; one cut at max_tokens is an object's start.
    content = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert r.choices[0].finish_reason == "length" and content.lstrip().startswith("{")


# ---- bad tool definitions ---------------------------------------------------------------------

def _tool(**fn):
    return {"type": "function", "function": fn}


BAD_TOOLS = [
    ({"tools": [_tool(parameters={"type": "object"})]}, "tools[0].function.name"),
    ({"tools": [_tool(name="get weather")]}, "tools[0].function.name"),
    ({"tools": [_tool(name="x" * 65)]}, "tools[0].function.name"),
    ({"tools": [_tool(name="f", parameters={"type": "array"})]}, "tools[0].function.parameters"),
    ({"tools": [_tool(name="f", parameters={"type": "object", "properties": {"a": {"type": "quaternion"}}})]},
     "tools[0].function.parameters"),
    ({"tools": [_tool(name="f", parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"grammar": "root ::= (("}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema"),
]


@pytest.mark.parametrize("extra,param", BAD_TOOLS)
def test_bad_tools_and_grammars_get_400(http, extra, param):
    for stream in (False, True):
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4,
                                                     "stream": stream, **extra})
        assert r.status_code == 400, r.text
        assert_valid("ErrorResponse", r.json())
        assert r.json()["error"]["param"] == param, r.json()
    assert http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 2}).status_code == 200
