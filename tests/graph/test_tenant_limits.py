"""Each key's limits and usage through a real local Ray Serve (both topologies) and the real model, with the
official SDKs: a key past its rate gets a 429 in its protocol's shape with the headers the SDKs read, a spent
budget finishes the reply under way and stops that key only, and GET /v1/usage shows each key its own usage
(an admin key every key's). Keys and limits: TENANT_KEYS (tests/support/serve_harness.py)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from app.tenants.policies import key_hash
from tests.support.serve_harness import KEY_A, MODEL, TENANT_KEYS

pytestmark = pytest.mark.timeout(600)

HELLO = [{"role": "user", "content": "Say hello."}]


def key(name: str) -> str:
    return TENANT_KEYS[name][0]


def sdk(cluster, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key(name), max_retries=0, timeout=120)


def usage(cluster, api_key: str) -> dict:
    r = httpx.get(f"{cluster.url}/v1/usage", headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_key_past_its_requests_per_minute_gets_openais_429_with_the_headers_its_sdk_reads(cluster) -> None:
    client = sdk(cluster, "rate")  # 2 a minute
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    response = refused.value.response
    assert refused.value.code == "rate_limit_exceeded" and refused.value.type == "requests"
    # What openai-python's retry logic reads before its own backoff, and what clients pace themselves by.
    assert 1 <= int(response.headers["retry-after"]) <= 30 and int(response.headers["retry-after-ms"]) > 0
    assert response.headers["x-ratelimit-limit-requests"] == "2"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    # Another key is not limited by it.
    openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=1)


def test_a_limited_key_on_the_messages_route_gets_anthropics_429(cluster) -> None:
    client = anthropic.Anthropic(base_url=cluster.url, api_key=key("rate-anthropic"), max_retries=0, timeout=120)
    client.messages.create(model=MODEL, max_tokens=1, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model=MODEL, max_tokens=1, messages=HELLO)
    body, headers = refused.value.body, refused.value.response.headers
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert headers["anthropic-ratelimit-requests-limit"] == "1" and int(headers["retry-after"]) >= 1
    assert not any(name.startswith("x-ratelimit") for name in headers)


def test_a_spent_budget_finishes_the_stream_under_way_and_stops_that_key_only(cluster) -> None:
    client = sdk(cluster, "budget")  # 1 token a day: the first request spends it all
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")  # answered to its end
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    assert refused.value.code == "insufficient_quota"
    assert "budget" in refused.value.message and int(refused.value.response.headers["retry-after"]) > 60
    mine = usage(cluster, key("budget"))["keys"]["budget"]
    assert mine["budget"]["used"] >= 2 and mine["models"][MODEL]["requests"] == 1
    assert mine["models"][MODEL]["completion_tokens"] >= 1 and mine["in_flight"] == 0


def test_usage_shows_a_key_its_own_and_an_admin_every_key(cluster) -> None:
    openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2)
    env_key_name = f"key-{key_hash(KEY_A)[:8]}"  # keys from the environment are named by their hash's start
    own = usage(cluster, KEY_A)
    assert list(own["keys"]) == [env_key_name] and own["degraded"] is False
    counted = own["keys"][env_key_name]["models"][MODEL]
    assert counted["requests"] >= 1 and counted["prompt_tokens"] > 0
    every = usage(cluster, key("admin"))["keys"]
    assert env_key_name in every and len(every) >= 2
    assert KEY_A not in str(every)  # the report names keys, never shows them


def test_usage_refuses_what_is_not_a_read_by_a_known_key(cluster) -> None:
    r = httpx.get(f"{cluster.url}/v1/usage", headers={"Authorization": "Bearer sk-not-a-key"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{cluster.url}/v1/usage", headers={"Authorization": f"Bearer {KEY_A}"}, json={}, timeout=60)
    assert r.status_code == 405
    # A query asking for another key's usage changes nothing: a key reads its own.
    r = httpx.get(f"{cluster.url}/v1/usage?key=admin", headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60)
    assert r.status_code == 200 and "admin" not in r.json()["keys"]
