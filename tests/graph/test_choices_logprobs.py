"""`n` choices and `logprobs` through the real graph, with the official openai SDK and raw SSE;
every body and chunk validated against OpenAI's spec."""

from __future__ import annotations

import math

import openai
import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import MODEL, REPRODUCIBLE, sse_json

pytestmark = pytest.mark.timeout(600)

MESSAGES = [{"role": "user", "content": "Name three animals that live in the sea."}]


def check_distribution(entries) -> None:
    """Each token: its top alternatives sorted, all log-probabilities, summing to at most 1."""
    for e in entries:
        top = [t["logprob"] if isinstance(t, dict) else t.logprob for t in (e["top_logprobs"] if isinstance(e, dict)
                                                                             else e.top_logprobs)]
        lp = e["logprob"] if isinstance(e, dict) else e.logprob
        assert top == sorted(top, reverse=True) and all(v <= 0 for v in top)
        assert sum(math.exp(v) for v in top) <= 1 + 1e-6
        assert lp <= 0 and (not top or lp <= top[0] + 1e-6)


def test_logprobs_with_the_sdk(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, seed=3, logprobs=True,
                                       top_logprobs=3)
    assert_valid("CreateChatCompletionResponse", r.model_dump(exclude_unset=True))
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 16
    assert all(len(e.top_logprobs) == 3 for e in entries)
    check_distribution(entries)
    assert bytes(b for e in entries for b in e.bytes).decode() == r.choices[0].message.content
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert plain.choices[0].logprobs is None  # nothing asked, nothing computed


def test_streamed_logprobs_equal_the_whole_reply(http):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, "seed": 5, "logprobs": True, "top_logprobs": 2,
            **REPRODUCIBLE}
    whole = http.post("/v1/chat/completions", json=body).json()
    assert_valid("CreateChatCompletionResponse", whole)
    chunks, _ = sse_json(http.post("/v1/chat/completions", json={**body, "stream": True}).text)
    streamed = []
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
        lp = c["choices"][0]["logprobs"] if c["choices"] else None
        streamed += lp["content"] if lp else []
    expected = whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in streamed] == [e["token"] for e in expected]
    assert all(math.isclose(a["logprob"], b["logprob"], abs_tol=1e-4) for a, b in zip(streamed, expected))


def test_n_choices_with_the_sdk(client):
    one = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=9)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=9, n=3, temperature=1.0)
    assert_valid("CreateChatCompletionResponse", r.model_dump(exclude_unset=True))
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason == "length" for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1  # each choice has its own seed
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt is counted once
    assert r.usage.completion_tokens == 36


def test_streamed_choices_interleave_and_match(http):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "seed": 4, "n": 2, "temperature": 1.0,
            "stream_options": {"include_usage": True}, **REPRODUCIBLE}
    whole = http.post("/v1/chat/completions", json={k: v for k, v in body.items() if k != "stream_options"}).json()
    chunks, events = sse_json(http.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert events[-1] == "[DONE]"
    texts, finishes = {0: "", 1: ""}, {}
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
        for ch in c["choices"]:
            texts[ch["index"]] += ch["delta"].get("content") or ""
            if ch["finish_reason"]:
                finishes[ch["index"]] = ch["finish_reason"]
    assert finishes == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    assert [texts[i] for i in (0, 1)] == [c["message"]["content"] for c in whole["choices"]]
    usage = chunks[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (whole["usage"]["prompt_tokens"],
                                                                    whole["usage"]["completion_tokens"])


def test_more_choices_than_slots_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, n=5)
    assert err.value.body["param"] == "n" and "n_seq_max" in err.value.body["message"]
