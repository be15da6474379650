"""Streams that wait for a slot, through a real graph in each topology: one slot (`n_seq_max: 1`), one
long reply holding it, a second stream queued behind it. The second gets its headers at once, `: keep-alive`
comments while it waits (`limits.stream_keepalive_s: 0.25`), then its reply; the openai SDK skips the
comments; an Anthropic stream opens with `message_start` (comments before it, never a `ping`); a client
that leaves while queued never reaches the model."""

from __future__ import annotations

import json
import threading
import time
from typing import Self

import httpx
import openai
import pytest

from app.config.spec import deployment_name
from tests.support.serve_harness import MODEL, POOL, SHAPES, ServeCluster, load_config, sse_json

# A long scenario (a graph of its own with one slot, and streams that wait in its queue): `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
MODEL_DEPLOYMENT = deployment_name(MODEL)
KEEPALIVE_S = 0.25
# At least 200 words (>= 200 tokens, seconds here): the slot stays busy long enough for the
# queued stream to see several keep-alive intervals.
LONG = {"max_tokens": 900, "seed": 1, "grammar": 'root ::= w{200}\nw ::= [a-z]{1,8} " "'}


@pytest.fixture(scope="module", params=SHAPES)
def kcluster(request):
    shape = request.param
    overlays = ("configs/local-cpu.yaml",) if shape == "single" else ("configs/local-cpu.yaml", "configs/local-graph.yaml")
    config = load_config(*overlays, {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 1024, "n_seq_max": 1}],
                 "limits": {"stream_keepalive_s": KEEPALIVE_S}},
        "deployments": [{"name": MODEL_DEPLOYMENT, "max_ongoing_requests": 1,
                         "autoscaling_config": {"target_ongoing_requests": 1}}],
    }]})
    POOL.release()
    with ServeCluster(config, num_cpus=2, serve_local=shape == "single") as c:
        yield c


def chat(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8,
            "stream": True, **kw}


def stats(cluster):
    return cluster.model_stats(MODEL)


class Blocker:
    """A long stream holding the only slot, read on a thread; `done_at` when its [DONE] came,
    `tokens` its completion tokens. (The model's handle, stats included, waits while it runs.)"""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.generating = threading.Event()
        self.done_at: float | None = None
        self.tokens: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.cluster.url, timeout=120) as c, \
                c.stream("POST", "/v1/chat/completions",
                     json=chat(**LONG, stream_options={"include_usage": True})) as r:
            for line in r.iter_lines():
                if line.startswith('data: {') and '"usage":{' in line:
                    self.tokens = json.loads(line[6:])["usage"]["completion_tokens"]
                if '"content":"' in line and '"content":""' not in line:
                    self.generating.set()
                if line == "data: [DONE]":
                    self.done_at = time.monotonic()

    def __enter__(self) -> Self:
        self.thread.start()
        assert self.generating.wait(60), "the blocking stream never started"
        return self

    def __exit__(self, *exc) -> None:
        # A deadline, not a pace: its 200+ tokens take seconds here, minutes on a machine that is busy.
        self.thread.join(480)


def test_queued_stream_gets_headers_then_keepalives_then_its_reply(kcluster):
    with Blocker(kcluster) as blocker, httpx.Client(base_url=kcluster.url, timeout=120) as c:
        t0 = time.monotonic()
        with c.stream("POST", "/v1/chat/completions", json=chat()) as r:
            headers_at = time.monotonic()
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert blocker.done_at is None  # the slot is still taken
            lines, first_data_at = [], None
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: ") and first_data_at is None:
                    first_data_at = time.monotonic()
    assert headers_at - t0 < 5, headers_at - t0
    assert blocker.done_at is not None and headers_at < blocker.done_at
    waited = [ln for ln in lines[:lines.index(next(ln for ln in lines if ln.startswith("data: ")))] if ln]
    assert len(waited) >= 2 and set(waited) == {": keep-alive"}, lines[:10]
    assert first_data_at > blocker.done_at - 1  # the reply came once the slot was free
    # (a comment may also come between chunks here: 0.25 s without data is possible on a busy machine)
    assert all(ln.startswith(("data: ", ": keep-alive")) for ln in lines if ln)
    chunks, events = sse_json("".join(ln + "\n\n" for ln in lines if ln.startswith("data: ")))
    assert events[-1] == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_openai_sdk_ignores_keepalive_comments(kcluster):
    client = openai.OpenAI(base_url=f"{kcluster.url}/v1", api_key="unused", max_retries=0, timeout=120)
    with Blocker(kcluster) as blocker:
        stream = client.chat.completions.create(**chat())
        chunks = list(stream)
        assert blocker.done_at is not None  # it did wait behind the blocker
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_queued_anthropic_stream_opens_with_message_start(kcluster):
    """Anthropic's stream starts with `message_start`; strict clients refuse a `ping` before it. While
    queued, the stream is kept alive by comments; pings may come only after it has opened."""
    body = {"model": MODEL, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with Blocker(kcluster) as blocker, httpx.Client(base_url=kcluster.url, timeout=120) as c, \
            c.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        frames = [f for f in r.read().decode().split("\n\n") if f.strip()]
        assert blocker.done_at is not None  # it did wait behind the blocker
    waited = frames[:next(i for i, f in enumerate(frames) if not f.startswith(":"))]
    assert len(waited) >= 2 and set(waited) == {": keep-alive"}, frames[:6]
    events = [f.split("\n")[0] for f in frames[len(waited):] if not f.startswith(":")]
    assert events[0] == "event: message_start", events[:3]
    assert events[-1] == "event: message_stop"
    assert "event: content_block_delta" in events


def test_client_leaving_while_queued_never_reaches_the_model(kcluster):
    steps = stats(kcluster)["steps"]  # llama_decode calls so far
    with Blocker(kcluster) as blocker, httpx.Client(base_url=kcluster.url, timeout=120) as c, \
            c.stream("POST", "/v1/chat/completions", json=chat(**LONG)) as r:
        assert r.status_code == 200
        assert next(r.iter_lines()) == ": keep-alive"
        # leaves here, while queued
    assert blocker.done_at is not None and blocker.tokens >= 200
    # Had the dropped request stayed queued, it would have run next (200+ decode steps); stats
    # waits behind it, so this counts every step either way: the blocker's prompt and tokens only.
    s = stats(kcluster)
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["steps"] - steps <= blocker.tokens + 3, (s["steps"] - steps, blocker.tokens)
