"""An Ollama request as the chat (or legacy) request it means, without a model: images before their message's text
as data URLs that declare no type; tool calls with ids (made up where the client sent none) and tool results
paired with the calls they answer (by id, else by name, else in order); thinking passed back as reasoning; `format`
and `think` as chat's fields; a raw generation without OpenAI's 16-token default."""

from __future__ import annotations

import json

import pytest

from app.ollama_api.mapping import chat_messages, to_chat_request, to_completion_request
from app.ollama_api.options import read_options
from app.ollama_api.schemas import parse_chat, parse_generate


def messages(*items):
    return chat_messages(parse_chat({"model": "m", "messages": list(items)}).messages)


def test_images_come_before_their_text_as_untyped_data_urls():
    out = messages({"role": "user", "content": "What is it?", "images": ["aGk=", "aG8="]})
    assert out == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:;base64,aGk="}},
        {"type": "image_url", "image_url": {"url": "data:;base64,aG8="}},
        {"type": "text", "text": "What is it?"}]}]
    assert messages({"role": "user", "content": "", "images": ["aGk="]})[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:;base64,aGk="}}]


def test_calls_and_their_results_pair_up():
    out = messages(
        {"role": "user", "content": "Weather in Paris and Lyon, and the time?"},
        {"role": "assistant", "content": "", "thinking": "two cities",
         "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}},
                        {"function": {"name": "weather", "arguments": {"city": "Lyon"}}},
                        {"id": "t1", "function": {"name": "time", "arguments": {}}}]},
        {"role": "tool", "content": "12:00", "tool_call_id": "t1"},
        {"role": "tool", "content": "sunny", "tool_name": "weather"},
        {"role": "tool", "content": "rain"})
    calls = out[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "call_1_1", "t1"] and out[1]["reasoning_content"] == "two cities"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert [m["tool_call_id"] for m in out[2:]] == ["t1", "call_1_0", "call_1_1"]


@pytest.mark.parametrize("fmt,expected", [
    ("json", {"type": "json_object"}),
    ({"type": "object"}, {"type": "json_schema", "json_schema": {"name": "format", "schema": {"type": "object"},
                                                                 "strict": None, "description": None}}),
])
def test_format_is_chats_response_format(fmt, expected):
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": fmt})
    mapped = to_chat_request(req, read_options(None))
    assert mapped.chat.response_format.model_dump(by_alias=True) == {"json_schema": None, **expected}


@pytest.mark.parametrize("think,fields,switches", [
    (None, {"include_reasoning": True, "reasoning_effort": None}, None),
    (True, {"include_reasoning": True, "reasoning_effort": None}, {"enable_thinking": True}),
    (False, {"include_reasoning": False, "reasoning_effort": None}, {"enable_thinking": False}),
    ("high", {"include_reasoning": True, "reasoning_effort": "high"}, {"enable_thinking": True}),
])
def test_think(think, fields, switches):
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "think": think})
    mapped = to_chat_request(req, read_options(None))
    assert {k: getattr(mapped.chat, k) for k in fields} == fields and mapped.chat.chat_template_kwargs == switches


def test_a_generation_is_system_then_prompt_and_a_raw_one_has_no_default_cut():
    req = parse_generate({"model": "m", "prompt": "Hi", "system": "Be brief.", "images": ["aGk="]})
    chat = to_chat_request(req, read_options({"num_predict": 5, "top_k": 3})).chat
    assert [m.role for m in chat.messages] == ["system", "user"] and (chat.max_tokens, chat.top_k) == (5, 3)
    assert [p.type for p in chat.messages[1].content] == ["image_url", "text"]
    raw = to_completion_request(parse_generate({"model": "m", "prompt": "<s>Hi", "raw": True}), read_options(None))
    assert raw.prompt == "<s>Hi" and raw.max_tokens is None


def test_a_suffix_is_an_insertion_between_prompt_and_suffix_without_the_template():
    req = parse_generate({"model": "m", "prompt": "def f(", "suffix": "):\n    pass\n", "options": {"num_predict": 9}})
    assert req.completes and not req.raw and not req.loads_only
    insertion = to_completion_request(req, read_options(req.options))
    assert (insertion.prompt, insertion.suffix, insertion.max_tokens) == ("def f(", "):\n    pass\n", 9)
    assert not parse_generate({"model": "m", "prompt": "", "suffix": "x"}).loads_only  # the start of a file
    plain = parse_generate({"model": "m", "prompt": "Hi", "suffix": ""})  # an empty suffix asks for nothing
    assert not plain.completes and to_completion_request(plain, read_options(None)).suffix is None
