"""How tools reach the prompt and the grammar, without a model."""

from __future__ import annotations

import json

import pytest

from app.api.errors import APIError
from app.api.schemas import parse_chat_request
from app.generation.plan import format_grammar
from app.parsers import ReplyParser
from app.prompt.tool_calling import plan_tools, resolve_reply_format
from tests.support.grammars import gbnf
from app.config.app_args import Limits

QWEN_LIKE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
             "Call with <tool_call></tool_call>{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def req(**kw):
    return parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_reply_format_detection():
    native = resolve_reply_format(QWEN_LIKE)
    assert native.native_tools and native.tool_parser == "hermes" and native.reasoning == "none"
    plain = resolve_reply_format(PLAIN)
    assert not plain.native_tools and plain.tool_parser == "hermes"
    # DeepSeek-R1 style: the generation prompt opens the reasoning
    think = resolve_reply_format(PLAIN + "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}")
    assert think.reasoning == "think" and think.starts_in_reasoning
    assert resolve_reply_format(PLAIN, "none", "mistral").tool_parser == "mistral"
    with pytest.raises(ValueError, match="unknown tool_parser"):
        resolve_reply_format(PLAIN, tools="xml")
    with pytest.raises(ValueError, match="unknown reasoning_parser"):
        resolve_reply_format(PLAIN, reasoning="cot")


def test_native_template_gets_tools_and_no_grammar_for_auto():
    r = req(tools=[WEATHER])
    plan = plan_tools(resolve_reply_format(QWEN_LIKE), r, [m.model_dump(exclude_none=True) for m in r.messages])
    assert plan.template_tools[0]["function"]["name"] == "get_weather"
    assert plan.parser == "hermes" and plan.grammar is None


def test_fallback_prompt_describes_tools_and_rewrites_history():
    r = req(tools=[WEATHER], tool_choice="required", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    plan = plan_tools(resolve_reply_format(PLAIN), r, [m.model_dump(exclude_none=True) for m in r.messages])
    assert plan.template_tools is None
    system = plan.messages[0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.")
    assert '"name": "get_weather"' in system["content"] and "<tool_call>" in system["content"]
    assert plan.messages[2] == {"role": "assistant", "content":
                                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'}
    assert plan.messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert 'start: "<tool_call>\\n" call "\\n</tool_call>"' in plan.grammar  # Lark, with the call as %json
    assert '"const": "get_weather"' in plan.grammar


def test_tool_choice_none_keeps_tools_out():
    r = req(tools=[WEATHER], tool_choice="none")
    plan = plan_tools(resolve_reply_format(QWEN_LIKE), r, [m.model_dump(exclude_none=True) for m in r.messages])
    assert plan.template_tools is None and plan.parser is None and plan.grammar is None


@pytest.mark.parametrize("kw,param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
])
def test_invalid_tools(kw, param):
    r = req(**kw)
    with pytest.raises(APIError) as info:
        plan_tools(resolve_reply_format(PLAIN), r, [])
    assert info.value.status == 400 and info.value.param == param


def test_format_grammar_choices():
    limits = Limits()
    assert format_grammar(req(), limits) is None
    assert format_grammar(req(grammar='root ::= "x"'), limits) == gbnf('root ::= "x"')
    assert '"json_schema":{"type":"object"' in format_grammar(req(response_format={"type": "json_object"}), limits)
    with pytest.raises(APIError) as info:
        format_grammar(req(grammar='root ::= "x"', response_format={"type": "json_object"}), limits)
    assert info.value.param == "grammar"
    with pytest.raises(APIError) as info:
        format_grammar(req(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), limits)
    assert info.value.param == "response_format.json_schema"


def test_the_parser_streams_calls_in_openai_shape():
    # A call's first delta: index, id, type, name and empty arguments; then the arguments alone.
    parser = ReplyParser(tools="hermes")
    out = parser.feed('hi<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>') + parser.finish()
    assert out[0] == {"content": "hi"}
    (head,), (args,) = out[1]["tool_calls"], out[2]["tool_calls"]
    assert head["id"].startswith("call_") and head == {"index": 0, "id": head["id"], "type": "function",
                                                     "function": {"name": "f", "arguments": ""}}
    assert args == {"index": 0, "function": {"arguments": '{"x": 1}'}}


def test_calls_to_functions_not_offered_are_not_claimed():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    parser = ReplyParser(tools="hermes", tool_names=frozenset({"get_weather"}))
    assert parser.parse(text) == {"content": text, "reasoning_content": None, "tool_calls": None}
    streamed = [d for piece in text for d in parser.feed(piece)] + parser.finish()
    assert "".join(d.get("content", "") for d in streamed) == text and not parser.made_tool_calls
    ok = ReplyParser(tools="hermes", tool_names=frozenset({"rm_rf"})).parse(text)
    assert ok["tool_calls"][0]["function"]["name"] == "rm_rf" and json.loads(ok["tool_calls"][0]["function"]["arguments"]) == {}
