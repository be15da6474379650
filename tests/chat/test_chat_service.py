"""ChatService on the real engine (no Ray): OpenAI responses and stream chunks, with exact usage."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from app.api.errors import APIError
from app.api.schemas import ChatCompletionRequest, parse_chat_request
from app.chat import ChatService
from app.generation.plan import sampling_from
from app.engine import GenerationRequest
from app.engine.events import Finished, Started, Text
from tests.support.engine_errors import mapped_stream
from app.prompt.chat_template import render_prompt
from tests.support.events import run_until_idle as run
from tests.support.openapi_spec import assert_valid
from tests.support.grammars import gbnf

# A hung engine must fail the test, not stall the run (pytest-timeout; generous for busy CPUs).
pytestmark = pytest.mark.timeout(300)

QUESTION = "Write a very long story about a dragon who loves bread."


@pytest.fixture(scope="module")
def opened() -> list[tuple[str, GenerationRequest]]:
    return []


@pytest.fixture(scope="module")
def service(bundled_spec, engine, opened) -> ChatService:
    async def open_stream(model_id: str, gen: GenerationRequest):
        opened.append((model_id, gen))
        assert model_id == bundled_spec.id
        async for batch in mapped_stream(engine, gen, 0):
            yield batch

    return ChatService([bundled_spec], open_stream)


def payload(bundled_spec, **fields) -> ChatCompletionRequest:
    """What the HTTP layer hands the backend: the request it validated."""
    body = {"model": bundled_spec.id, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "max_tokens": 8, **fields}
    return parse_chat_request(body)


def expected_prompt_tokens(engine, bundled_spec, messages) -> int:
    return len(engine.llama.tokenize(render_prompt(bundled_spec.chat_template, messages)))


async def collect(stream) -> list[dict[str, Any]]:
    """The chunks; the first batch is the empty "accepted" marker, every later one holds chunks."""
    assert await anext(stream) == []
    chunks = []
    async for batch in stream:
        assert isinstance(batch, list) and batch, "batches are non-empty lists"
        chunks.extend(batch)
    return chunks


# ---- complete ----------------------------------------------------------------------------------

def test_complete_valid_response_with_exact_usage(service, engine, bundled_spec, opened):
    body = run(engine, service.complete(payload(bundled_spec, max_tokens=9, seed=5)))
    assert_valid("CreateChatCompletionResponse", body)
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == bundled_spec.id
    assert abs(body["created"] - time.time()) < 60
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    n_prompt = expected_prompt_tokens(engine, bundled_spec, [{"role": "user", "content": QUESTION}])
    usage = body["usage"]
    assert usage["prompt_tokens"] == n_prompt
    assert usage["completion_tokens"] == 9
    assert usage["total_tokens"] == n_prompt + 9
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < n_prompt
    # what reached the model
    model_id, gen = opened[-1]
    assert model_id == bundled_spec.id
    assert gen.max_tokens == 9
    assert gen.sampling.temperature == 0 and gen.sampling.seed == 5
    assert gen.prompt == render_prompt(bundled_spec.chat_template, [{"role": "user", "content": QUESTION}],
                                          mark_content=True)


def test_complete_stop_is_cut(service, engine, bundled_spec):
    full = run(engine, service.complete(payload(bundled_spec, max_tokens=16)))["choices"][0]["message"]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 2]
    body = run(engine, service.complete(payload(bundled_spec, max_tokens=16, stop=stop)))
    assert_valid("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"]["content"] == full[: full.find(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 16


def test_complete_multi_turn_usage(service, engine, bundled_spec):
    messages = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Colour of the sky?"},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "grass?"}]}]
    body = run(engine, service.complete(payload(bundled_spec, messages=messages, max_completion_tokens=5)))
    assert_valid("CreateChatCompletionResponse", body)
    template_msgs = messages[:3] + [{"role": "user", "content": "And grass?"}]
    assert body["usage"]["prompt_tokens"] == expected_prompt_tokens(engine, bundled_spec, template_msgs)
    assert body["usage"]["completion_tokens"] <= 5


def test_complete_unknown_model_404(service, engine, bundled_spec, opened):
    before = len(opened)
    with pytest.raises(APIError) as info:
        run(engine, service.complete(payload(bundled_spec, model="no-such-model")))
    assert info.value.status == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert len(opened) == before


def test_complete_bad_grammar_is_400(service, engine, bundled_spec):
    with pytest.raises(APIError) as info:
        run(engine, service.complete(payload(bundled_spec, grammar='root ::= ("x"')))
    assert info.value.status == 400 and info.value.param == "grammar"


def test_complete_context_overflow_is_400(service, engine, bundled_spec):
    with pytest.raises(APIError) as info:
        run(engine, service.complete(payload(bundled_spec, max_tokens=1020)))
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"


# ---- stream ------------------------------------------------------------------------------------

def _check_chunks(chunks: list[dict[str, Any]], include_usage: bool, model: str) -> list[dict[str, Any]]:
    """Common stream invariants; returns the chunks that carry a choice."""
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == model
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1
    with_choice = [c for c in chunks if c["choices"]]
    first = with_choice[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert first["finish_reason"] is None
    finishes = [c for c in with_choice if c["choices"][0]["finish_reason"] is not None]
    assert len(finishes) == 1
    assert finishes[0] is with_choice[-1]
    assert finishes[0]["choices"][0]["delta"] == {}
    for c in with_choice[1:-1]:
        assert set(c["choices"][0]["delta"]) == {"content"}
    if include_usage:
        assert chunks[-1]["choices"] == []
        assert len(with_choice) == len(chunks) - 1
        for c in with_choice:
            assert "usage" in c and c["usage"] is None
    else:
        assert len(with_choice) == len(chunks)
        assert all("usage" not in c for c in chunks)
    return with_choice


def test_stream_with_usage(service, engine, bundled_spec):
    p = payload(bundled_spec, max_tokens=7, stream=True, stream_options={"include_usage": True})
    chunks = run(engine, collect(service.stream(p)))
    with_choice = _check_chunks(chunks, include_usage=True, model=bundled_spec.id)
    assert with_choice[-1]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    n_prompt = expected_prompt_tokens(engine, bundled_spec, [{"role": "user", "content": QUESTION}])
    assert usage["prompt_tokens"] == n_prompt
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == n_prompt + 7
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_stream_without_usage_matches_complete(service, engine, bundled_spec):
    p = payload(bundled_spec, max_tokens=10, stream=True, cache_prompt=False)
    chunks = run(engine, collect(service.stream(p)))
    with_choice = _check_chunks(chunks, include_usage=False, model=bundled_spec.id)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in with_choice)
    body = run(engine, service.complete(payload(bundled_spec, max_tokens=10, cache_prompt=False)))
    assert text == body["choices"][0]["message"]["content"]  # greedy, whole prefills: same text either way


def test_stream_include_usage_false(service, engine, bundled_spec):
    p = payload(bundled_spec, max_tokens=3, stream=True, stream_options={"include_usage": False})
    chunks = run(engine, collect(service.stream(p)))
    _check_chunks(chunks, include_usage=False, model=bundled_spec.id)


def test_stream_stop_finish_reason(service, engine, bundled_spec):
    full = run(engine, service.complete(payload(bundled_spec, max_tokens=16, cache_prompt=False)))
    full = full["choices"][0]["message"]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 2]
    p = payload(bundled_spec, max_tokens=16, stop=[stop], stream=True, stream_options={"include_usage": True},
                cache_prompt=False)
    chunks = run(engine, collect(service.stream(p)))
    with_choice = _check_chunks(chunks, include_usage=True, model=bundled_spec.id)
    assert with_choice[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in with_choice)
    assert text == full[: full.find(stop)]


def test_stream_unknown_model_404(service, engine, bundled_spec):
    async def go():
        with pytest.raises(APIError) as info:
            await collect(service.stream(payload(bundled_spec, model="nope", stream=True)))
        return info.value
    err = run(engine, go())
    assert err.status == 404 and err.code == "model_not_found"


# ---- with a fake model stream: the service's own checks ----------------------------------------

def _fake_service(bundled_spec, batches):
    async def open_stream(model_id, gen):
        for b in batches:
            yield b
    return ChatService([bundled_spec], open_stream)


def test_stream_without_end_is_502(bundled_spec):
    svc = _fake_service(bundled_spec, [[Started(prompt_tokens=3, cached_tokens=0)], [Text("hi", 1)]])

    async def go():
        got = []
        with pytest.raises(APIError) as info:
            async for batch in svc.stream(payload(bundled_spec, stream=True)):
                got.extend(batch)
        return got, info.value

    got, err = asyncio.run(go())
    assert err.status == 502 and err.code == "incomplete_generation"
    assert [c["choices"][0]["delta"] for c in got] == [{"role": "assistant", "content": ""}, {"content": "hi"}]


def test_complete_without_end_is_502(bundled_spec):
    svc = _fake_service(bundled_spec, [[Started(prompt_tokens=3, cached_tokens=0)]])
    with pytest.raises(APIError) as info:
        asyncio.run(svc.complete(payload(bundled_spec)))
    assert info.value.status == 502


def test_sampling_from_request():
    req = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.3,
                              "top_k": 3, "repeat_penalty": 1.2, "seed": 9, "presence_penalty": -1})
    p = sampling_from(req)
    assert (p.temperature, p.top_k, p.repeat_penalty, p.seed, p.presence_penalty) == (0.3, 3, 1.2, 9, -1)
    assert p.top_p == 0.95 and p.min_p == 0.05  # llama.cpp defaults when the request says nothing


def test_grammar_reaches_the_engine(service, engine, bundled_spec, opened):
    grammar = 'root ::= "<think>" [a-z ]{1,40} "</think>" [a-z ]{1,40}'
    body = run(engine, service.complete(payload(bundled_spec, max_tokens=120, grammar=grammar,
                                                temperature=0.8, seed=2)))
    assert opened[-1][1].sampling.grammar == gbnf(grammar)  # llguidance's, converted while planning
    assert_valid("CreateChatCompletionResponse", body)
    message = body["choices"][0]["message"]
    # the bundled template has no reasoning format, so the whole constrained text is content
    assert "reasoning_content" not in message
    assert re.fullmatch(r"<think>[a-z ]{1,40}</think>[a-z ]{1,40}", message["content"]), message
    assert body["choices"][0]["finish_reason"] == "stop"


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


def test_a_call_cut_at_the_end_of_the_context_ends_with_length(service, engine, bundled_spec):
    # No room left to continue the cut call: the reply ends with `length`, never a 400 mid-request.
    def ask(words: int, max_tokens: int) -> dict[str, Any]:
        body = payload(bundled_spec, messages=[{"role": "user", "content": "weather " * words + "in Paris?"}],
                       tools=[WEATHER_TOOL], tool_choice="required", max_tokens=max_tokens)
        return run(engine, service.complete(body))

    per_word = (ask(200, 1)["usage"]["prompt_tokens"] - ask(100, 1)["usage"]["prompt_tokens"]) / 100
    base = ask(100, 1)["usage"]["prompt_tokens"]
    words = 100 + int((bundled_spec.n_ctx - 12 - base) / per_word)
    prompt_tokens = ask(words, 1)["usage"]["prompt_tokens"]
    room = bundled_spec.n_ctx - prompt_tokens
    assert 4 <= room <= 30, room  # a forced call needs more than this
    body = ask(words, room)
    assert body["choices"][0]["finish_reason"] == "length"  # even when a cut call went out
    assert body["usage"]["completion_tokens"] == room
    # A call whose arguments had opened streamed out, so it stays, with the arguments generated
    # before the cut; one cut before that is no call.
    for call in body["choices"][0]["message"].get("tool_calls") or []:
        assert call["function"]["name"] == "get_weather" and call["function"]["arguments"].startswith("{")


def test_a_cut_call_is_the_same_streamed_and_not(bundled_spec):
    # The call's arguments streamed out as they came; the cut leaves them short, in both paths alike.
    cut = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    rounds = []

    async def open_stream(model_id, gen):
        rounds.append(gen)
        yield [Started(prompt_tokens=3, cached_tokens=0)]
        if len(rounds) == 1:
            yield [Text(cut, 20)]
        yield [Finished("length", 3, 20 if len(rounds) == 1 else 0, 0)]

    svc = ChatService([bundled_spec], open_stream)
    req = {"tools": [WEATHER_TOOL], "max_tokens": 20}
    body = asyncio.run(svc.complete(payload(bundled_spec, **req)))
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_weather", '{"city": "Par')
    assert body["choices"][0]["message"]["content"] == "Checking."

    rounds.clear()
    chunks = asyncio.run(collect(svc.stream(payload(bundled_spec, stream=True, **req))))
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    parts = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert parts[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(p["function"]["arguments"] for p in parts) == '{"city": "Par'
    assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] == "length"
