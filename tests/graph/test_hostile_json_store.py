"""Non-finite numbers and a store flood through the real graph, in each topology; no replica is replaced.

- A JSON number that is not finite (`1e999`, which Python reads as inf; `NaN`, `Infinity`) was read, echoed
  (a Responses tool's `default`, a `text.format` schema's `x-*`), stored, then failed to serialise: a 500 after
  the response was stored, a 500 on every later GET, and a bare `Infinity` in the streamed events. Now every
  route that takes a JSON body refuses it as a 400 in its protocol's shape, and what is written is strict JSON.
- One key writing big responses flushed every key's stored responses out of the one LRU store. Now a key's
  writes evict its own entries: key B's response survives key A writing past A's budget. The shared clusters
  run with a small store (tests/support/serve_harness.py: 8 MiB, 2 MiB a key) so a few requests show it.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.serve_harness import EMBED_MODEL, KEY_A, KEY_B, MODEL, RERANK_MODEL

pytestmark = pytest.mark.timeout(600)

BAD_NUMBERS = ["1e999", "NaN", "-Infinity"]
# (path, body with %s where the number goes, streams); each must be refused before any model work.
ROUTES = [
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], '
                             '"response_format": {"type": "json_schema", "json_schema": {"name": "n", '
                             '"schema": {"type": "number", "default": %%s}}}}' % MODEL, True),
    ("/v1/completions", '{"model": "%s", "prompt": "hi", "temperature": %%s}' % MODEL, True),
    ("/infill", '{"model": "%s", "input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x", '
                '"n": %%s}]}' % MODEL, True),
    ("/v1/responses", '{"model": "%s", "input": "hi", "max_output_tokens": 4, "tools": [{"type": "function", '
                      '"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "number", '
                      '"default": %%s}}}}]}' % MODEL, True),
    ("/v1/responses", '{"model": "%s", "input": "hi", "max_output_tokens": 4, "text": {"format": {"type": '
                      '"json_schema", "name": "n", "schema": {"type": "number", "x-limit": %%s}}}}' % MODEL, True),
    ("/v1/responses/input_tokens", '{"model": "%s", "input": "hi", "tools": [{"type": "function", "name": "f", '
                                   '"parameters": {"type": "object", "default": %%s}}]}' % MODEL, False),
    ("/v1/embeddings", '{"model": "%s", "input": "hi", "dimensions": %%s}' % EMBED_MODEL, False),
    ("/v1/rerank", '{"model": "%s", "query": "q", "documents": ["d"], "top_n": %%s}' % RERANK_MODEL, False),
    ("/tokenize", '{"model": "%s", "prompt": "hi", "extra": [%%s]}' % MODEL, False),
    ("/detokenize", '{"model": "%s", "tokens": [1, %%s]}' % MODEL, False),
]
ANTHROPIC_ROUTES = [
    ("/v1/messages", '{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], '
                     '"tools": [{"name": "f", "input_schema": {"type": "object", "default": %%s}}]}' % MODEL, True),
    ("/v1/messages/count_tokens", '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], '
                                  '"tools": [{"name": "f", "input_schema": {"type": "object", "x": %%s}}]}' % MODEL,
     False),
]


def strict(text: str):
    """JSON as a strict parser reads it: a bare NaN/Infinity fails."""
    def refuse(name):
        raise ValueError(f"{name} in a body we wrote")
    return json.loads(text, parse_constant=refuse)


def post_raw(http, path: str, body: str, stream: bool) -> httpx.Response:
    if stream:
        body = body[:-1] + ', "stream": true}'
    return http.post(path, content=body.encode(), headers={"Content-Type": "application/json"})


def test_non_finite_numbers_are_refused_on_every_json_route(cluster, http):
    before = cluster.identities()
    for path, template, streams in ROUTES + ANTHROPIC_ROUTES:
        for number in BAD_NUMBERS:
            for stream in (False, True) if streams else (False,):
                r = post_raw(http, path, template % number, stream)
                assert r.status_code == 400, (path, number, stream, r.status_code, r.text[:300])
                body = strict(r.text)
                if path.startswith("/v1/messages"):
                    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
                else:
                    assert body["error"]["code"] == "non_finite_number", body
                message = body["error"]["message"]
                assert "not finite" in message and number in message, (path, message)
    assert cluster.identities() == before


def test_a_large_finite_number_is_echoed_stored_and_streamed_as_strict_json(cluster, http):
    before = cluster.identities()
    template = next(t for path, t, _ in ROUTES if path == "/v1/responses")  # the one with a function tool
    r = post_raw(http, "/v1/responses", template % "1e308", False)
    assert r.status_code == 200, r.text[:300]
    made = strict(r.text)
    assert made["tools"][0]["parameters"]["properties"]["n"]["default"] == 1e308
    got = http.get(f"/v1/responses/{made['id']}")
    assert got.status_code == 200 and strict(got.text) == made
    streamed = post_raw(http, "/v1/responses", template % "-1.5e300", True)
    assert streamed.status_code == 200
    events = [strict(line[len("data: "):]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    final = events[-1]["response"]
    assert final["tools"][0]["parameters"]["properties"]["n"]["default"] == -1.5e300
    assert strict(http.get(f"/v1/responses/{final['id']}").text)["id"] == final["id"]
    assert cluster.identities() == before


# Each of key A's responses echoes a schema whose description makes it ~1.5 MB: past A's 2 MiB budget with
# two, past the whole 8 MiB store with six.
BIG_SCHEMA = {"type": "string", "maxLength": 4, "description": "x" * 1_500_000}
FLOOD = 6


def responses(http, key: str, body: dict) -> httpx.Response:
    return http.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"})


def stored(http, key: str, response_id: str) -> int:
    return http.get(f"/v1/responses/{response_id}", headers={"Authorization": f"Bearer {key}"}).status_code


def test_one_key_writing_past_its_budget_evicts_only_its_own_responses(cluster, http):
    before = cluster.identities()
    b = responses(http, KEY_B, {"model": MODEL, "input": "Remember me.", "max_output_tokens": 4})
    assert b.status_code == 200, b.text[:300]
    b_id = b.json()["id"]
    flood = []
    for i in range(FLOOD):
        body = {"model": MODEL, "input": f"Item {i}.", "max_output_tokens": 2, "stream": i % 2 == 1,
                "text": {"format": {"type": "json_schema", "name": "big", "schema": BIG_SCHEMA}}}
        r = responses(http, KEY_A, body)
        assert r.status_code == 200, r.text[:300]
        if body["stream"]:
            final = [strict(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")][-1]
            flood.append(final["response"]["id"])
        else:
            flood.append(r.json()["id"])
    # A's writes took A's own oldest out, not B's (which is older than all of them).
    assert stored(http, KEY_B, b_id) == 200
    assert stored(http, KEY_A, flood[-1]) == 200
    assert stored(http, KEY_A, flood[0]) == 404
    follow = responses(http, KEY_B, {"model": MODEL, "input": "And now?", "max_output_tokens": 2,
                                     "previous_response_id": b_id, "store": False})
    assert follow.status_code == 200, follow.text[:300]
    assert cluster.identities() == before


def test_echoed_fields_that_never_reach_the_prompt_are_bounded(http):
    cases = [({"user": "u" * 257}, "user"),
             ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
             ({"metadata": {"k": "v" * 513}}, "metadata"),
             ({"text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": {"type": "string"}}}},
              "text.format.name"),
             ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {"type": "string"}}}},
              "text.format.name"),
             ({"text": {"format": {"type": "json_schema", "name": "n", "description": "d" * 4097,
                                   "schema": {"type": "string"}}}}, "text.format.description")]
    for fields, param in cases:
        for stream in (False, True):
            r = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2,
                                                 "stream": stream, **fields})
            assert r.status_code == 400, (param, r.text[:300])
            assert r.json()["error"]["param"] == param, (param, r.json())
