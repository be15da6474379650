"""A web page as the attacker, through the real graph in each topology (the shared clusters, which require
keys): what a page can send without a CORS preflight (a POST of text/plain or a form, a `no-cors` fetch, a
request from a foreign Origin) reaches no model, whatever the key, and its preflights get no CORS headers;
a loopback page and clients that send no Origin are served. No replica is replaced.

What applies only without keys (a rebound Host name) is checked on the keyless clusters of
tests/graph/test_tracing.py, and app/http/browser_guard.py's unit tests (tests/http/test_browser_guard.py)
cover each case."""

from __future__ import annotations

import json

import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import KEY_A, MODEL

pytestmark = pytest.mark.timeout(600)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
CHAT_BYTES = json.dumps(CHAT).encode()
MESSAGES = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Say hi."}]}
EVIL = "https://evil.example"
LOCAL_PAGE = "http://localhost:5173"  # a web app on the user's own machine


def no_cors_headers(r) -> None:
    assert "access-control-allow-origin" not in r.headers, dict(r.headers)


@pytest.mark.parametrize("content_type", ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_bodies_a_page_sends_without_preflight_are_415_in_each_protocol(cluster, http, content_type):
    before = cluster.identities()
    # A valid JSON body, even with a key: JSON is what the routes read, declared as JSON.
    r = http.post("/v1/chat/completions", content=CHAT_BYTES, headers={"Content-Type": content_type})
    assert r.status_code == 415, r.text
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["code"] == "unsupported_media_type"
    r = http.post("/v1/messages", content=json.dumps(MESSAGES).encode(),
                  headers={"Content-Type": content_type, "anthropic-version": "2023-06-01"})
    assert r.status_code == 415 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/embeddings", content=b'{"model": "minilm", "input": "x"}',
                     headers={"Content-Type": content_type}).status_code == 415
    assert cluster.identities() == before


def test_a_form_post_from_a_page_is_refused(http):
    r = http.post("/v1/chat/completions", data={"model": MODEL, "messages": "x"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text


@pytest.mark.parametrize("origin", [EVIL, "null"])
def test_a_foreign_origin_reaches_no_route_with_or_without_a_key(cluster, http, origin):
    before = cluster.identities()
    for auth in ({}, {"Authorization": f"Bearer {KEY_A}"}):
        # fetch(url, {mode: "no-cors", method: "POST", body}) from the page: text/plain, no preflight.
        r = http.post("/v1/chat/completions", content=CHAT_BYTES, headers={
            "Origin": origin, "Content-Type": "text/plain;charset=UTF-8", **auth})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
        no_cors_headers(r)
        r = http.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin, **auth})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
        r = http.get("/v1/models", headers={"Origin": origin, **auth})
        assert r.status_code == 403, r.text
        r = http.post("/v1/messages", json=MESSAGES, headers={"Origin": origin, **auth})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
    # The preflight of a request that would carry the key is refused too: the browser never sends it.
    r = http.options("/v1/chat/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 403, r.text
    no_cors_headers(r)
    assert cluster.identities() == before


def test_a_loopback_page_and_clients_without_origin_are_served(http):
    pre = http.options("/v1/chat/completions", headers={
        "Origin": LOCAL_PAGE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == LOCAL_PAGE
    r = http.post("/v1/chat/completions", json=CHAT, headers={"Origin": LOCAL_PAGE})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == LOCAL_PAGE, r.text
    r = http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    no_cors_headers(r)
    # JSON with a charset, and a raw body with no Content-Type at all (a raw HTTP client), are read.
    r = http.post("/v1/chat/completions", content=CHAT_BYTES, headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", content=CHAT_BYTES)
    assert r.status_code == 200, r.text


def test_with_keys_any_host_name_is_served_and_the_key_decides(cluster, http):
    # A cluster behind a load balancer is called by its name: with keys, the Host is not checked.
    r = http.post("/v1/chat/completions", json=CHAT, headers={"Host": "llm.company.example"})
    assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json=CHAT, headers={"Host": "evil.example:8000", "Authorization": ""})
    assert r.status_code == 401, r.text
