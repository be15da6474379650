"""An agent's turn with a long shared preamble, for the tests of the KV kept beyond the replica (app/kvstore): the
preamble is past `kv_cache.min_tokens`, so a replica keeps it on its node's disk and in the cluster's store."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.serve_harness import MODEL

PREAMBLE = ("You are a careful assistant for a shipping company. " * 20 + "Tools: track(id), refund(id), "
            "address(id). Always answer in one sentence. " * 10)  # ~400 tokens: past kv_cache.min_tokens


def ask_after_preamble(cluster: Any, question: str, timeout: float = 120) -> dict[str, Any]:
    """`question` after PREAMBLE as the system prompt, greedy, 8 tokens; the reply's usage (its `cached_tokens`)."""
    r = httpx.post(f"{cluster.url}/v1/chat/completions", headers=cluster.headers, timeout=timeout, json={
        "model": MODEL, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()["usage"]
