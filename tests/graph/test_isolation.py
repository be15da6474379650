"""One caller's cached prompts tell another nothing, through the real graph in each topology: key B never
sees `cached_tokens` > 0 for a prefix only key A sent (not for the prompt itself, nor for a guess that
extends it, the cheap probe of /v1/completions with max_tokens 1), while key A still reuses its own;
`cache_salt` separates further within one key."""

from __future__ import annotations

import uuid

import pytest

from tests.support.serve_harness import KEY_A, KEY_B, MODEL

pytestmark = pytest.mark.timeout(600)
PREAMBLE = "You are the support assistant of a small bakery. Answer in one short sentence. " * 8


def cached(http, key: str, prompt: str, route: str = "chat", **extra) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    if route == "chat":
        body = {"model": MODEL, "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "Hi"}],
                "max_tokens": 1, **extra}
        r = http.post("/v1/chat/completions", json=body, headers=headers)
    else:
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1, **extra},
                      headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_key_never_sees_another_keys_prefix(http, route):
    secret = PREAMBLE + f"The door code is {uuid.uuid4().hex}."
    cached(http, KEY_A, secret, route)
    assert cached(http, KEY_A, secret, route) > 0  # A reuses its own prompt
    # A guess extending A's prompt (in a scope of B's own that holds nothing yet: its salt)
    assert cached(http, KEY_B, secret + " Also", route, cache_salt="probe") == 0
    assert cached(http, KEY_B, secret, route) == 0  # A's very prompt
    assert cached(http, KEY_B, secret, route) > 0  # B's own prompt, sent once now, is B's to reuse
    assert cached(http, KEY_A, secret, route) > 0  # and A's is still A's


def test_cache_salt_separates_within_one_key(http):
    prompt = PREAMBLE + f"Order number {uuid.uuid4().hex}."
    cached(http, KEY_A, prompt)
    assert cached(http, KEY_A, prompt, cache_salt="team-1") == 0
    assert cached(http, KEY_A, prompt, cache_salt="team-1") > 0
    assert cached(http, KEY_A, prompt, cache_salt="team-2") == 0
    assert cached(http, KEY_A, prompt, cache_prompt=False) == 0  # nothing reused when asked not to
