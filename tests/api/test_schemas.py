"""parse_chat_request: what the server accepts, and the 400 (with `param`) for what it rejects."""

from __future__ import annotations

import pytest

from app.api.errors import APIError
from app.api.schemas import (
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    ToolMessage,
    UserMessage,
    parse_chat_request,
)

USER = [{"role": "user", "content": "hi"}]


def req(**fields):
    return {"model": "m", "messages": USER, **fields}


def reject(payload) -> APIError:
    with pytest.raises(APIError) as info:
        parse_chat_request(payload)
    err = info.value
    assert err.status == 400
    assert err.type == "invalid_request_error"
    assert err.message  # never an empty message
    body = err.to_dict()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return err


# ---- valid requests ----------------------------------------------------------------------------

def test_minimal_request():
    r = parse_chat_request({"model": "smollm2", "messages": USER})
    assert isinstance(r, ChatCompletionRequest)
    assert r.model == "smollm2"
    assert len(r.messages) == 1
    assert isinstance(r.messages[0], UserMessage)
    assert r.messages[0].content == "hi"
    assert r.stream is False
    assert r.stop_list == []
    assert r.completion_limit is None
    assert r.include_usage is False


def test_full_request_with_every_message_kind():
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": "dev note"},
            {"role": "user", "content": [{"type": "text", "text": "What is "},
                                         {"type": "text", "text": "the weather?"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "max_completion_tokens": 64,
        "stop": ["END"],
        "seed": 7,
        "presence_penalty": -1.5,
        "frequency_penalty": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "top_k": 20,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        # extras that SDKs send are ignored
        "metadata": {"k": "v"},
        "store": False,
        "some_future_field": 1,
    }
    r = parse_chat_request(payload)
    kinds = [type(m) for m in r.messages]
    assert kinds == [SystemMessage, SystemMessage, UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert r.messages[1].role == "developer"
    assert [p.text for p in r.messages[2].content] == ["What is ", "the weather?"]
    call = r.messages[3]
    assert call.content is None
    assert call.tool_calls[0].id == "call_1"
    assert call.tool_calls[0].function.name == "get_weather"
    assert call.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert r.messages[4].tool_call_id == "call_1"
    assert r.temperature == 0.2 and r.top_p == 0.9 and r.seed == 7
    assert r.top_k == 20 and r.min_p == 0.05 and r.repeat_penalty == 1.1
    assert r.tools[0].function.name == "get_weather"
    assert r.response_format.json_schema.schema_ == {"type": "object"}
    assert r.include_usage is True
    assert r.completion_limit == 64
    dumped = r.model_dump(exclude_none=True)
    assert "metadata" not in dumped and "some_future_field" not in dumped and "store" not in dumped


def test_extra_fields_inside_messages_are_ignored():
    r = parse_chat_request(req(messages=[{"role": "user", "content": "x", "weird": 1}]))
    assert "weird" not in r.messages[0].model_dump()


def test_named_tool_choice_and_string_stop():
    r = parse_chat_request(req(tool_choice={"type": "function", "function": {"name": "f"}}, stop="###"))
    assert r.tool_choice.function == {"name": "f"}
    assert r.stop_list == ["###"]


def test_boundary_values_are_accepted():
    r = parse_chat_request(req(temperature=2, top_p=0, presence_penalty=-2, max_tokens=1, n=1, logprobs=False,
                               stop=["a", "b", "c", "d"]))
    assert r.temperature == 2 and r.top_p == 0 and r.max_tokens == 1
    assert r.stop_list == ["a", "b", "c", "d"]


# ---- properties --------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, expected", [
    ({}, None),
    ({"max_tokens": 10}, 10),
    ({"max_completion_tokens": 20}, 20),
    ({"max_tokens": 10, "max_completion_tokens": 20}, 20),  # the newer name wins
])
def test_completion_limit(fields, expected):
    assert parse_chat_request(req(**fields)).completion_limit == expected


@pytest.mark.parametrize("stop, expected", [
    (None, []),
    ("x", ["x"]),
    (["a", "b"], ["a", "b"]),
])
def test_stop_list(stop, expected):
    assert parse_chat_request(req(stop=stop)).stop_list == expected


@pytest.mark.parametrize("fields, expected", [
    ({"stream": True, "stream_options": {"include_usage": True}}, True),
    ({"stream": True, "stream_options": {"include_usage": False}}, False),
    ({"stream": True}, False),
    ({"stream": False, "stream_options": {"include_usage": True}}, False),
    ({"stream_options": {"include_usage": True}}, False),
])
def test_include_usage(fields, expected):
    assert parse_chat_request(req(**fields)).include_usage is expected


# ---- invalid requests --------------------------------------------------------------------------

def test_missing_model():
    err = reject({"messages": USER})
    assert err.param == "model"
    assert err.code == "missing_required_parameter"
    assert "model" in err.message


def test_empty_model_string():
    err = reject(req(model=""))
    assert err.param == "model"


def test_empty_messages():
    err = reject(req(messages=[]))
    assert err.param == "messages"
    assert err.code == "invalid_value"
    assert "messages" in err.message


def test_missing_messages():
    err = reject({"model": "m"})
    assert err.param == "messages"
    assert err.code == "missing_required_parameter"


def test_unknown_role():
    err = reject(req(messages=[{"role": "user", "content": "ok"}, {"role": "wizard", "content": "x"}]))
    assert err.param == "messages[1].role"
    assert "wizard" in err.message
    assert "assistant" in err.message  # lists what is expected


def test_unknown_role_first_message():
    err = reject(req(messages=[{"role": "wizard", "content": "x"}]))
    assert err.param == "messages[0].role"


@pytest.mark.parametrize("field, value", [
    ("temperature", 2.5),
    ("temperature", -0.1),
    ("top_p", -0.1),
    ("top_p", 1.5),
    ("presence_penalty", 3),
    ("frequency_penalty", -2.5),
    ("max_tokens", 0),
    ("max_completion_tokens", 0),
    ("top_logprobs", 21),
    ("min_p", 1.5),
    ("repeat_penalty", 0),
])
def test_out_of_range(field, value):
    err = reject(req(**{field: value}))
    assert err.param == field
    assert err.code == "invalid_value"
    assert f"`{field}`" in err.message


def test_temperature_message_names_the_bound():
    err = reject(req(temperature=2.5))
    assert "2" in err.message and "less than or equal" in err.message


def test_n_and_logprobs_reach_the_engine_settings():
    r = parse_chat_request(req(n=3, logprobs=True, top_logprobs=4))
    assert (r.choices, r.logprobs_k) == (3, 4)
    assert parse_chat_request(req(logprobs=True)).logprobs_k == 0
    assert parse_chat_request(req()).logprobs_k is None and parse_chat_request(req()).choices == 1


def test_top_logprobs_needs_logprobs():
    err = reject(req(top_logprobs=2))
    assert err.param == "top_logprobs" and err.code == "unsupported_parameter"


def test_five_stop_strings():
    err = reject(req(stop=["a", "b", "c", "d", "e"]))
    assert err.param == "stop"
    assert "4" in err.message


def test_empty_stop_string():
    err = reject(req(stop=["a", ""]))
    assert err.param == "stop"
    assert "empty" in err.message


def test_tool_message_without_tool_call_id():
    err = reject(req(messages=[{"role": "tool", "content": "result"}]))
    assert err.param == "messages[0].tool_call_id"
    assert err.code == "missing_required_parameter"


def test_assistant_without_content_or_tool_calls():
    err = reject(req(messages=USER + [{"role": "assistant"}]))
    assert err.param == "messages[1]"
    assert "content" in err.message and "tool_calls" in err.message


def test_assistant_with_empty_tool_calls_and_no_content():
    err = reject(req(messages=USER + [{"role": "assistant", "content": None, "tool_calls": []}]))
    assert err.param == "messages[1]"


def test_tool_function_name_with_space():
    err = reject(req(tools=[{"type": "function", "function": {"name": "get weather"}}]))
    assert err.param == "tools[0].function.name"
    assert "^[a-zA-Z0-9_-]{1,64}$" in err.message


def test_tool_function_name_too_long():
    err = reject(req(tools=[{"type": "function", "function": {"name": "f" * 65}}]))
    assert err.param == "tools[0].function.name"


def test_tool_call_missing_arguments():
    err = reject(req(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f"}}]}]))
    assert err.param == "messages[0].tool_calls[0].function.arguments"
    assert err.code == "missing_required_parameter"


def test_bad_response_format_type():
    err = reject(req(response_format={"type": "xml"}))
    assert err.param == "response_format.type"


@pytest.mark.parametrize("body", [[1, 2], "hello", 42, None, True])
def test_body_not_an_object(body):
    err = reject(body)
    assert err.param is None
    assert "JSON object" in err.message


def test_multiple_errors_are_counted():
    err = reject({"model": "m", "messages": USER, "temperature": 9, "top_p": 9})
    assert err.param == "temperature"
    assert "(and 1 more error)" in err.message


# Regression: `user` is also a role tag; the top-level field once lost its name (param=None).
def test_invalid_user_field_names_its_param():
    err = reject(req(user=123))
    assert err.param == "user"
    assert "`user`" in err.message
