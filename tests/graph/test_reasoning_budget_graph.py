"""Reasoning budgets through the shared test graph, in both topologies, with the real clients (`openai`,
`anthropic`, raw `httpx` for SSE).

THINKING_MODEL is the bundled 135M model under a template whose generation prompt opens `<think>` (as DeepSeek-R1's
does); the model does not think by itself, but with its ends of generation biased away (`logit_bias` -100) all it
writes is inside the reasoning the prompt opened, and only a budget closes it. So each test proves what the server
does with a reasoning that runs long: it stops within the budget plus the closing message, the answer follows,
`reasoning_tokens` is exact (budget + the close's tokens, counted by the model's own tokenizer through /tokenize),
streamed and whole replies agree, and each protocol's field reaches the same budget. Not that a real reasoning
model answers better for it.
"""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import KEY_A, REPRODUCIBLE, THINKING_CLOSE, THINKING_MODEL, sse_json

pytestmark = pytest.mark.timeout(600)

NO_END = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: the model never ends a reply by itself
ASK = [{"role": "user", "content": "How many legs does a spider have? Think step by step."}]
MAX = 32


def count(http, text: str) -> int:
    r = http.post("/tokenize", json={"model": THINKING_MODEL, "prompt": text, "add_special": False})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def close_tokens(http, budget: int) -> int:
    """The tokens of the close the engine takes: the model entry's message (after some reasoning: THINKING_CLOSE)
    and the end marker."""
    return (count(http, THINKING_CLOSE) if budget else 0) + count(http, "</think>")


def body(**fields):
    return {"model": THINKING_MODEL, "messages": ASK, "max_tokens": MAX, "temperature": 0, "logit_bias": NO_END,
            **REPRODUCIBLE, **fields}


def test_a_budget_closes_the_reasoning_and_the_answer_follows(http):
    whole = http.post("/v1/chat/completions", json=body(thinking_budget_tokens=16))
    assert whole.status_code == 200, whole.text
    reply = whole.json()
    assert_valid("CreateChatCompletionResponse", reply)
    msg, usage = reply["choices"][0]["message"], reply["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 16 + close_tokens(http, 16)
    assert msg["reasoning_content"].endswith(THINKING_CLOSE.strip())  # then the marker closed it
    assert msg["content"]  # the answer, generated after the close
    assert reply["choices"][0]["finish_reason"] == "length" and usage["completion_tokens"] == MAX

    r = http.post("/v1/chat/completions", json=body(thinking_budget_tokens=16, stream=True,
                                                     stream_options={"include_usage": True}))
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]"
    for chunk in chunks:
        assert_valid("CreateChatCompletionStreamResponse", chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    assert chunks[-1]["usage"] == usage


def test_a_budget_of_zero_skips_the_reasoning_and_none_leaves_it_unbounded(http):
    zero = http.post("/v1/chat/completions", json=body(thinking_budget_tokens=0)).json()
    assert zero["usage"]["completion_tokens_details"]["reasoning_tokens"] == close_tokens(http, 0)
    assert not zero["choices"][0]["message"].get("reasoning_content") and zero["choices"][0]["message"]["content"]
    effort_none = http.post("/v1/chat/completions", json=body(reasoning_effort="none")).json()
    assert effort_none["choices"][0]["message"] == zero["choices"][0]["message"]
    unbounded = http.post("/v1/chat/completions", json=body()).json()
    usage = unbounded["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"] == MAX


def test_enable_thinking_false_reaches_a_template_that_reads_it(http):
    """THINKING_TEMPLATE reads `enable_thinking`: switched off, it writes an empty reasoning block itself, so the
    reply starts as the answer (no reasoning to count)."""
    off = http.post("/v1/chat/completions", json=body(chat_template_kwargs={"enable_thinking": False})).json()
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert not off["choices"][0]["message"].get("reasoning_content")
    on = http.post("/v1/chat/completions", json=body(chat_template_kwargs={"enable_thinking": True})).json()
    assert on["usage"]["completion_tokens_details"]["reasoning_tokens"] == MAX


def test_a_grammar_and_a_forced_call_apply_to_the_answer_after_the_reasoning(client, http):
    r = http.post("/v1/chat/completions", json=body(thinking_budget_tokens=8, grammar='root ::= "yes" | "no"',
                                                     max_tokens=40))
    reply = r.json()
    msg = reply["choices"][0]["message"]
    assert msg["content"] in ("yes", "no") and msg["reasoning_content"] and reply["choices"][0]["finish_reason"] == "stop"
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
    called = client.chat.completions.create(model=THINKING_MODEL, messages=ASK, max_tokens=60, temperature=0,
                                            logit_bias=NO_END, tools=[weather], tool_choice="required",
                                            extra_body={"thinking_budget_tokens": 8, **REPRODUCIBLE})
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] in ("Paris", "Rome")
    assert (choice.message.model_extra or {}).get("reasoning_content")


def test_each_protocols_field_reaches_the_budget(cluster, http):
    # Responses: reasoning.effort, through the model entry's table (THINKING_MODEL: low = 8).
    r = http.post("/v1/responses", json={"model": THINKING_MODEL, "input": ASK[0]["content"], "max_output_tokens": MAX,
                                         "temperature": 0, "reasoning": {"effort": "low"}, "store": False,
                                         "cache_prompt": False})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens_details"]["reasoning_tokens"] == 8 + close_tokens(http, 8)
    assert [item["type"] for item in r.json()["output"]] == ["reasoning", "message"]
    # Messages: thinking.enabled's budget_tokens (Anthropic's least, 1024: more than this reply's max_tokens), and
    # thinking.disabled (the template's switch: an answer without reasoning).
    client = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120)
    msg = client.messages.create(model=THINKING_MODEL, max_tokens=24, messages=ASK, extra_body={"temperature": 0},
                                 thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in msg.content] == ["thinking", "text"]  # never closed: also delivered as the answer
    off = client.messages.create(model=THINKING_MODEL, max_tokens=24, messages=ASK, extra_body={"temperature": 0},
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=THINKING_MODEL, max_tokens=24, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 5000})
    assert "thinking.budget_tokens" in str(info.value)


@pytest.mark.parametrize("fields, param", [
    ({"thinking_budget_tokens": 5000}, "thinking_budget_tokens"),  # past the model's completion limit (n_ctx 1024)
    ({"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
    ({"thinking_budget_tokens": "16"}, "thinking_budget_tokens"),
    ({"thinking_budget_tokens": 1.5}, "thinking_budget_tokens"),
    ({"thinking_budget_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}}, "thinking_budget_tokens"),
    ({"chat_template_kwargs": {"system_prompt": "x"}}, "chat_template_kwargs.system_prompt"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
])
def test_out_of_range_budgets_and_free_form_switches_are_400s_naming_the_field(http, fields, param):
    r = http.post("/v1/chat/completions", json=body(**fields))
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
