"""Legacy /v1/completions and /tokenize, /detokenize end to end: real Ray Serve graph, real model,
the official openai SDK; every body and chunk validated against OpenAI's spec (CreateCompletionResponse)."""

from __future__ import annotations

import math

import pytest

from tests.support.openapi_spec import assert_valid, assert_valid_completion
from tests.support.serve_harness import MODEL, REPRODUCIBLE, sse_json

pytestmark = pytest.mark.timeout(600)

PROMPT = "The capital of France is"


def check_logprobs(lps: dict, k: int, first_null: bool = False) -> None:
    n = len(lps["tokens"])
    assert len(lps["token_logprobs"]) == len(lps["top_logprobs"]) == len(lps["text_offset"]) == n
    assert lps["text_offset"] == sorted(lps["text_offset"])
    for i, (token, value, top) in enumerate(zip(lps["tokens"], lps["token_logprobs"], lps["top_logprobs"])):
        if first_null and i == 0:
            assert value is None and top is None
            continue
        assert value <= 0
        assert 1 <= len(top) <= k + 1 and token in top
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert all(v <= 0 for v in top.values())
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-3


def test_sdk_completion_shape_and_usage_match_tokenize(client, http):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=3,
                                                      temperature=0)
    body = raw.http_response.json()
    assert_valid_completion(body)
    completion = raw.parse()
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert choice.index == 0 and choice.text and choice.finish_reason in ("length", "stop")
    assert body["choices"][0]["logprobs"] is None
    tokens = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    assert completion.usage.prompt_tokens == tokens["count"] == len(tokens["tokens"])
    assert completion.usage.completion_tokens <= 8
    # the default max_tokens is OpenAI's 16
    default = client.completions.create(model=MODEL, prompt=PROMPT, seed=3, temperature=0, stop=None)
    assert default.usage.completion_tokens <= 16
    assert default.choices[0].finish_reason == "length" or default.usage.completion_tokens < 16


def test_stream_matches_and_ends_with_done(client, http):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, seed=5, temperature=0,
                                     extra_body=REPRODUCIBLE)
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "seed": 5,
                                           "temperature": 0, "stream": True,
                                           "stream_options": {"include_usage": True}, **REPRODUCIBLE})
    assert r.status_code == 200
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    for chunk in chunks:
        assert_valid_completion(chunk)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == full.choices[0].text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == full.choices[0].finish_reason
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == full.usage.completion_tokens
    # the SDK's own stream reader
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, seed=5, temperature=0, stream=True, extra_body=REPRODUCIBLE)
        if c.choices)
    assert text == full.choices[0].text


def test_echo_returns_prompt_and_text(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=1, temperature=0,
                                      extra_body=REPRODUCIBLE)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=1, temperature=0, echo=True,
                                       extra_body=REPRODUCIBLE)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text


def test_logprobs_legacy_shape(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2, seed=2)
    body = raw.http_response.json()
    assert_valid_completion(body)
    (choice,) = body["choices"]
    lps = choice["logprobs"]
    assert len(lps["tokens"]) == body["usage"]["completion_tokens"]
    check_logprobs(lps, 2)
    assert lps["text_offset"][0] == 0


def test_prompt_list_with_n(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=["One, two,", "Red, green,"], n=2,
                                                      max_tokens=4, seed=9)
    body = raw.http_response.json()
    assert_valid_completion(body)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["finish_reason"] in ("length", "stop") for c in body["choices"])
    assert body["usage"]["completion_tokens"] <= 4 * 4


def test_prompt_scores_prefill_only(client, http):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True,
                                                      logprobs=1)
    body = raw.http_response.json()
    assert_valid_completion(body)
    (choice,) = body["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    lps = choice["logprobs"]
    count = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()["count"]
    assert len(lps["tokens"]) == body["usage"]["prompt_tokens"] == count
    assert "".join(lps["tokens"]) == PROMPT
    check_logprobs(lps, 1, first_null=True)


def test_tokenize_round_trip_and_chat_count(client, http):
    text = "Hello there, how are you? Ça va très bien, merci."
    r = http.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert r.status_code == 200
    tokens = r.json()
    assert tokens["max_model_len"] == 1024 and tokens["count"] == len(tokens["tokens"])
    r = http.post("/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]})
    assert r.status_code == 200 and r.json() == {"prompt": text}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <|im_end|> there"}]
    counted = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()["count"]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == counted


def test_tokenizer_errors(http):
    r = http.post("/detokenize", json={"model": MODEL, "tokens": [1, 10**7]})
    assert r.status_code == 400
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == "tokens[1]" and r.json()["error"]["code"] == "invalid_token"
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x " * 2000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt" and "the prompt" in r.json()["error"]["message"]
