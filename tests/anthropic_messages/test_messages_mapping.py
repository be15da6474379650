"""A Messages request's validation (Anthropic's strictness, refusals naming the field) and its mapping onto
the chat request it means."""

from __future__ import annotations

import json

import pytest

from app.anthropic_messages.mapping import ERROR_PREFIX, to_chat_request
from app.anthropic_messages.schemas import parse_count_tokens_request, parse_messages_request
from app.api.errors import APIError

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def request(**fields):
    body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return parse_messages_request(body)


def refused(body_fields: dict, *, count: bool = False) -> APIError:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **({} if count else {"max_tokens": 8}),
            **body_fields}
    with pytest.raises(APIError) as info:
        req = (parse_count_tokens_request if count else parse_messages_request)(body)
        to_chat_request(req)
    assert info.value.status == 400
    return info.value


def chat_of(**fields) -> dict:
    return to_chat_request(request(**fields)).chat.model_dump(exclude_none=True, by_alias=True)


# ---- mapping -----------------------------------------------------------------------------------

def test_plain_text_request():
    chat = chat_of(system="Be brief.", temperature=0.5, top_p=0.9, top_k=20, stop_sequences=["\n\n", "END"],
                   metadata={"user_id": "u-1"}, stream=True)
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["top_k"]) == (32, 0.5, 0.9, 20)
    assert chat["stop"] == ["\n\n", "END"] and chat["user"] == "u-1" and chat["stream"] is True
    assert "tools" not in chat and "tool_choice" not in chat


def test_system_blocks_and_text_blocks_join():
    chat = chat_of(system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two.",
                                                               "cache_control": {"type": "ephemeral"}}],
                   messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "text", "text": "b"}]}])
    assert chat["messages"] == [{"role": "system", "content": "One.\nTwo."}, {"role": "user", "content": "a\nb"}]


def test_tool_round_trip_maps_to_calls_and_tool_messages():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call it.", "signature": ""},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Lyon"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_02", "content": [{"type": "text", "text": "no data"}],
             "is_error": True},
            {"type": "text", "text": "And so?"}]},
    ]
    chat = chat_of(messages=messages, tools=[WEATHER])
    assert chat["messages"][1] == {
        "role": "assistant", "content": "Let me check.", "reasoning_content": "I should call it.",
        "tool_calls": [{"id": "toolu_01", "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
                       {"id": "toolu_02", "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lyon"})}}]}
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_02", "content": ERROR_PREFIX + "no data"},
        {"role": "user", "content": "And so?"}]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city", "parameters": WEATHER["input_schema"]}}]


def test_redacted_thinking_is_dropped():
    chat = chat_of(messages=[{"role": "user", "content": "q"},
                             {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xx"},
                                                               {"type": "text", "text": "a"}]},
                             {"role": "user", "content": "more"}])
    assert chat["messages"][1] == {"role": "assistant", "content": "a"}


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, {"tool_choice": "auto"}),
    ({"type": "any"}, {"tool_choice": "required"}),
    ({"type": "tool", "name": "get_weather"},
     {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ({"type": "none"}, {"tool_choice": "none"}),
    ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
])
def test_tool_choice(choice, expected):
    chat = chat_of(tools=[WEATHER], tool_choice=choice)
    assert {k: chat[k] for k in ("tool_choice", "parallel_tool_calls") if k in chat} == expected


@pytest.mark.parametrize("thinking, switches, budget", [
    ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}, 1024),
    ({"type": "adaptive"}, {"enable_thinking": True}, None),
    ({"type": "disabled"}, {"enable_thinking": False}, None),
    (None, None, None),
])
def test_thinking_becomes_the_template_switch_and_the_reasoning_budget(thinking, switches, budget):
    fields = {"max_tokens": 2048} if thinking else {}
    if thinking:
        fields["thinking"] = thinking
    chat = to_chat_request(request(**fields)).chat
    assert chat.chat_template_kwargs == switches
    assert chat.thinking_budget_tokens == budget


def test_output_format_is_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_of(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_accepted_and_ignored_fields():
    chat = chat_of(cache_control={"type": "ephemeral", "ttl": "5m"}, service_tier="auto", inference_geo="us",
                   cache_prompt=False)
    assert chat["cache_prompt"] is False


def test_count_tokens_maps_the_same_prompt_fields():
    req = parse_count_tokens_request({"model": "m", "system": "s", "messages": [{"role": "user", "content": "Hi"}],
                                      "tools": [WEATHER], "tool_choice": {"type": "any"}})
    chat = to_chat_request(req).chat.model_dump(exclude_none=True)
    gen = chat_of(system="s", tools=[WEATHER], tool_choice={"type": "any"})
    assert {k: chat[k] for k in ("messages", "tools", "tool_choice")} == \
        {k: gen[k] for k in ("messages", "tools", "tool_choice")}


# ---- refusals, each naming its field -------------------------------------------------------------

@pytest.mark.parametrize("fields, param, words", [
    ({"max_tokens": None}, "max_tokens", "Field required"),
    ({"foo": 1}, "foo", "Extra inputs are not permitted"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"max_tokens": "10"}, "max_tokens", "valid integer"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text", "Field required"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]}]},
     "messages.0.content.0.bogus", "Extra inputs"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "'user' or 'assistant'"),
    ({"tool_choice": {"type": "bogus"}}, "tool_choice", "does not match any of the expected tags"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking.budget_tokens", "greater than or equal to 1024"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences", "at most 4"),
    ({"tools": [{**WEATHER, "input_schema": {"type": "array"}}]}, "tools.0.input_schema.type", "'object'"),
    ({"tools": [{**WEATHER, "name": "x" * 65}]}, "tools.0.name", "1,64"),
    ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other", "Extra inputs"),
])
def test_invalid_fields_are_named(fields, param, words):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(APIError) as info:
        parse_messages_request(body)
    err = info.value
    assert (err.status, err.param) == (400, param), err.message
    assert err.message.startswith(f"{param}: ") and words in err.message, err.message


@pytest.mark.parametrize("fields, param, words", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
     "messages.0.content.0.source.media_type", "required"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages.0.content.0.source", "'base64', 'url'"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages.0.content.0.type", "text (and images"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.type", "'text'"),
    ({"system": [{"type": "text", "text": "s", "citations": [{"type": "char_location"}]}]}, "system.0.citations",
     "citations"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type", "server tool"),
    ({"container": "c-1"}, "container", "containers"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers", "MCP"),
    ({"service_tier": "priority"}, "service_tier", "'auto' or 'standard_only'"),
])
def test_unsupported_features_are_refused_by_name(fields, param, words):
    err = refused(fields)
    assert err.param == param and words in err.message, err.message


def test_mapping_refusals():
    err = refused({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure,"}]})
    assert err.param == "messages.1" and "prefill" in err.message
    err = refused({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]})
    assert err.param == "messages.0.content.0.type" and "assistant messages" in err.message
    err = refused({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}})
    assert err.param == "tool_choice.name"


def test_count_tokens_is_as_strict():
    assert refused({"max_tokens": 5}, count=True).param == "max_tokens"  # not a field of a token count
    assert refused({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
                   count=True).param == "messages.0.content.0.type"


def test_image_blocks_become_chat_image_parts_in_order():
    chat = chat_of(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, {"type": "text", "text": "these:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert chat["messages"][-1]["content"] == [
        {"type": "text", "text": "Compare\nthese:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]


def test_a_replys_blocks_pass_back_as_they_are():
    """The blocks of a reply, as the SDK dumps them (`caller`, `citations: null`), are valid input."""
    chat = chat_of(tools=[WEATHER], messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": ""},
            {"type": "text", "text": "a", "citations": None},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"},
             "caller": {"type": "direct"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}])
    assert chat["messages"][1]["tool_calls"][0]["id"] == "toolu_1"
    err = refused({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}, "caller": {"type": "code_execution_20250825"}}]},
        {"role": "user", "content": "r"}]})
    assert err.param == "messages.1.content.0.caller.type", err.message


def test_count_tokens_takes_no_generation_fields():
    for field, value in (("stream", True), ("temperature", 0.5), ("stop_sequences", ["x"])):
        assert refused({field: value}, count=True).param == field
