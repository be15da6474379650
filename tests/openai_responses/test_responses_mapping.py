"""The Responses request: what is refused (a 400 naming the field), and how it maps to the chat request."""

from __future__ import annotations

import pytest

from app.api.errors import APIError
from app.openai_responses.mapping import output_messages, to_turn
from app.openai_responses.schemas import parse_responses_request
from app.openai_responses.shaping import (
    function_call_item,
    message_item,
    reasoning_item,
)


def parse(**fields):
    return parse_responses_request({"model": "m", "input": "hi", **fields})


def refused(**fields) -> APIError:
    with pytest.raises(APIError) as err:
        to_turn(parse(**fields))
    assert err.value.status == 400
    return err.value


@pytest.mark.parametrize("tool", ["web_search", "web_search_preview", "file_search", "computer_use_preview",
                                  "code_interpreter", "mcp", "image_generation", "local_shell", "custom"])
def test_built_in_tools_are_refused_naming_the_tool(tool):
    err = refused(tools=[{"type": "function", "name": "f", "parameters": {}, "strict": True}, {"type": tool}])
    assert err.param == "tools[1].type" and tool in err.message


@pytest.mark.parametrize("fields, param", [
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"unknown_field": 1}, "unknown_field"),
    ({"temperature": "0.5"}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "xx"}]}, "input"),
    ({"input": []}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
])
def test_unsupported_or_invalid_fields_are_400s_naming_them(fields, param):
    assert refused(**fields).param == param


def test_input_images_become_chat_image_parts():
    turn = to_turn(parse(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"}]}]))
    assert turn.chat.messages[-1].model_dump(exclude_none=True)["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}}]


def test_defaults_and_ignored_fields_are_accepted():
    req = parse(include=[], background=False, truncation="disabled", service_tier="auto", prompt_cache_key="k",
                safety_identifier="u1", max_tool_calls=3, reasoning={"effort": "low", "summary": "auto"},
                stream_options=None)
    chat = to_turn(req).chat
    assert chat.reasoning_effort == "low"


def test_string_input_and_instructions():
    turn = to_turn(parse(instructions="Be brief.", max_output_tokens=7, temperature=0.3, top_p=0.9, seed=4,
                         stop=["\n"], user="u"))
    chat = turn.chat
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p, chat.seed, chat.stop, chat.user) == \
        (7, 0.3, 0.9, 4, ["\n"], "u")
    assert turn.messages == [{"role": "user", "content": "hi"}]  # instructions are not the conversation's


def test_items_become_chat_messages():
    items = [
        {"role": "system", "content": "sys"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{\"x\":1}",
         "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
        {"role": "developer", "content": "dev"},
    ]
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}, "strict": False} for n in "fg"]
    turn = to_turn(parse(input=items, tools=tools, tool_choice={"type": "function", "name": "g"},
                         parallel_tool_calls=False))
    assert turn.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "think", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "developer", "content": "dev"},
    ]
    chat = turn.chat
    assert [t.function.name for t in chat.tools] == ["f", "g"] and chat.tools[0].function.strict is False
    assert chat.tool_choice.function == {"name": "g"} and chat.parallel_tool_calls is False


def test_a_call_without_text_and_reasoning_alone():
    turn = to_turn(parse(input=[
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
    ]))
    assert turn.messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert turn.messages[3] == {"role": "assistant", "content": "", "reasoning_content": "hm"}


def test_output_items_read_back_as_the_client_would_send_them():
    output = [reasoning_item("rs_1", "why"), message_item("msg_1", "Hi."),
              function_call_item("fc_1", "call_9", "f", "{}")]
    assert output_messages(output) == [{"role": "assistant", "content": "Hi.", "reasoning_content": "why",
                                        "tool_calls": [{"id": "call_9", "type": "function",
                                                        "function": {"name": "f", "arguments": "{}"}}]}]
    # the same items as input: the same messages, so the replay renders the same prompt
    assert to_turn(parse(input=[{"role": "user", "content": "hi"}, *output])).messages[1:] == output_messages(output)


@pytest.mark.parametrize("fmt, expected", [
    ({"type": "text"}, {"type": "text"}),
    ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True},
     {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True}}),
])
def test_text_format_becomes_response_format(fmt, expected):
    chat = to_turn(parse(text={"format": fmt})).chat
    assert chat.response_format.model_dump(by_alias=True, exclude_none=True) == expected


def test_history_comes_first_under_the_new_instructions():
    history = [{"role": "user", "content": "old"}, {"role": "assistant", "content": "reply"}]
    turn = to_turn(parse(instructions="new rules", input="next"), history)
    assert [m.content for m in turn.chat.messages] == ["new rules", "old", "reply", "next"]
    assert turn.conversation([message_item("msg_2", "answer")]) == [
        *history, {"role": "user", "content": "next"}, {"role": "assistant", "content": "answer"}]
