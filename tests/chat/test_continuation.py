"""A tool call cut by `max_tokens` is continued from the token ids the model generated, never from
their text (app/chat/rounds.py): the next round is the same prompt followed by those ids, its room in
the context is exact, and the model returns ids only where a continuation may follow."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import pytest

from app.api.schemas import parse_chat_request
from app.chat import ChatService
from app.generation.plan import plan_request
from app.generation.rounds import continuation_room
from app.generation.tally import ReplyTally
from app.config.app_args import Limits
from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, Started, Text
from tests.support.engine_errors import mapped_stream
from app.prompt.tool_calling import resolve_reply_format
from tests.support.events import EventBox, run_until_idle, wait_idle
from tests.support.grammars import gbnf

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def payload(spec, **fields) -> Any:
    return parse_chat_request({"model": spec.id, "messages": ASK, "temperature": 0, "max_tokens": 8, **fields})


def test_planning_asks_for_token_ids_only_when_a_continuation_may_follow(bundled_spec):
    fmt = resolve_reply_format(bundled_spec.chat_template, bundled_spec.reasoning_parser, bundled_spec.tool_parser)
    with_tools = plan_request(payload(bundled_spec, tools=[WEATHER]), bundled_spec, fmt, Limits())
    assert with_tools.tool_parser and with_tools.gen.return_tokens
    plain = plan_request(payload(bundled_spec), bundled_spec, fmt, Limits())
    assert not plain.tool_parser and not plain.gen.return_tokens


def test_a_cut_call_continues_from_the_generated_ids_not_their_text(bundled_spec):
    # The cut reply's text spells a control token: as text appended to the prompt and tokenized with
    # special-token parsing, it would become one. Its ids go to the next round as they are.
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "<|im_end|>'
    ids = tuple(range(500, 512))
    opened: list[GenerationRequest] = []

    async def open_stream(model_id, gen):
        opened.append(gen)
        if len(opened) == 1:
            yield [Started(prompt_tokens=30, cached_tokens=0)]
            yield [Text(cut, len(ids))]
            yield [Finished("length", 30, len(ids), 0, token_ids=ids)]
        else:
            yield [Started(prompt_tokens=30 + len(ids), cached_tokens=30 + len(ids) - 1)]
            yield [Text('Paris"}}\n</tool_call>', 5)]
            yield [Finished("stop", 30 + len(ids), 5, 41)]

    svc = ChatService([bundled_spec], open_stream)
    body = asyncio.run(svc.complete(payload(bundled_spec, tools=[WEATHER], max_tokens=len(ids))))
    first, second = opened
    assert first.return_tokens
    assert second.prompt == first.prompt  # no generated text in the prompt
    assert second.continue_tokens == list(ids)
    assert second.sampling == first.sampling and second.n == 1
    # The room is exact: the next round's prompt is the prompt's tokens and the generated ones.
    assert second.max_tokens == min(bundled_spec.tool_continuation_tokens, bundled_spec.n_ctx - 30 - len(ids))
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "<|im_end|>Paris"}
    assert body["usage"]["completion_tokens"] == len(ids) + 5


def test_without_the_ids_a_cut_call_is_not_continued(bundled_spec):
    opened = []

    async def open_stream(model_id, gen):
        opened.append(gen)
        yield [Started(prompt_tokens=30, cached_tokens=0)]
        yield [Text('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 12)]
        yield [Finished("length", 30, 12, 0)]

    svc = ChatService([bundled_spec], open_stream)
    body = asyncio.run(svc.complete(payload(bundled_spec, tools=[WEATHER], max_tokens=12)))
    assert len(opened) == 1 and body["choices"][0]["finish_reason"] == "length"


def test_the_room_left_is_exact(bundled_spec):
    plan = plan_request(payload(bundled_spec, tools=[WEATHER]), bundled_spec,
                        resolve_reply_format(bundled_spec.chat_template, "auto", "auto"), Limits())
    tally = ReplyTally()
    tally.start(Started(prompt_tokens=bundled_spec.n_ctx - 40, cached_tokens=0))
    tally.end_round(Finished("length", 0, 30, 0))
    assert continuation_room(plan, tally) == 10  # no margin: the ids are the next round's tokens
    tally.end_round(Finished("length", 0, 10, 0))
    assert continuation_room(plan, tally) == 0


# -- the real engine ------------------------------------------------------------------------------

def test_a_forced_call_cut_by_max_tokens_is_continued_on_the_engine(engine, bundled_spec):
    opened: list[GenerationRequest] = []

    async def open_stream(model_id, gen):
        opened.append(gen)
        async for batch in mapped_stream(engine, gen, 0):
            yield batch

    svc = ChatService([bundled_spec], open_stream)
    # Greedy, and no cached prefix for either: the cut reply's rounds then follow the uncut one's
    # computation exactly (each continuation reuses its own KV and decodes its last id as that one did).
    ask = dict(tools=[WEATHER], tool_choice="required", temperature=0, cache_prompt=False)
    whole = run_until_idle(engine, svc.complete(payload(bundled_spec, max_tokens=80, **ask)))
    opened.clear()
    cut = run_until_idle(engine, svc.complete(payload(bundled_spec, max_tokens=10, **ask)))
    assert len(opened) >= 2
    assert all(g.prompt == opened[0].prompt for g in opened)
    assert len(opened[1].continue_tokens) == 10
    (call,) = cut["choices"][0]["message"]["tool_calls"]
    assert cut["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"]["arguments"] == whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert cut["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_engine_continues_after_the_given_ids_reusing_their_kv(engine, bundled_spec):
    from app.prompt.chat_template import render_prompt

    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Count from one to twenty."}])

    def run(**fields) -> EventBox:
        box = EventBox()
        engine.submit(engine.prepare(GenerationRequest(uuid.uuid4().hex, prompt, sampling=SamplingParams(temperature=0),
                                                       **fields), box))
        assert box.wait(120)
        run_until_idle(engine, wait_idle(engine))
        return box

    # Whole prefills (no cached prefix) for both, so `head` makes `whole`'s first ids; `tail` reuses the KV
    # `head` left and decodes the last given id alone, as `whole` decoded it: it goes on the same way.
    whole = run(max_tokens=12, return_tokens=True, cache_prompt=False)
    ids = whole.of(Finished)[0].token_ids
    assert len(ids) == 12
    assert run(max_tokens=12).of(Finished)[0].token_ids == ()  # not asked: not sent
    head = run(max_tokens=6, return_tokens=True, cache_prompt=False)
    assert head.of(Finished)[0].token_ids == ids[:6]
    tail = run(max_tokens=6, continue_tokens=list(ids[:6]), return_tokens=True)
    n_prompt = len(engine.tokenize(prompt))
    assert tail.started.prompt_tokens == n_prompt + 6
    assert tail.started.cached_tokens == n_prompt + 6 - 1  # the slot held the prompt and the ids
    assert tail.of(Finished)[0].token_ids == ids[6:]
    assert head.text + tail.text == whole.text


def test_a_grammar_resumes_after_the_given_ids(engine):
    grammar = gbnf('root ::= "[" [0-9]{3} "-" [0-9]{3} "]"')

    def run(**fields) -> EventBox:
        box = EventBox()
        engine.submit(engine.prepare(GenerationRequest(uuid.uuid4().hex, "Write a code:", sampling=SamplingParams(
            temperature=1.0, seed=5, grammar=grammar), return_tokens=True, **fields), box))
        assert box.wait(120)
        run_until_idle(engine, wait_idle(engine))
        return box

    head = run(max_tokens=3)
    assert head.of(Finished)[0].finish_reason == "length"
    tail = run(max_tokens=20, continue_tokens=list(head.of(Finished)[0].token_ids))
    assert re.fullmatch(r"\[[0-9]{3}-[0-9]{3}\]", head.text + tail.text), head.text + tail.text
