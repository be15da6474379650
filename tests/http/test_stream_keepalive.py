"""The HTTP side of stream keep-alive, with a fake backend that is slow on purpose: which errors keep
their HTTP status (planning, and the model's first answer within the header grace) and which become
an SSE error event (after the headers went out), and the `: keep-alive` comments in between."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.api.errors import context_length_exceeded, invalid_request
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from tests.support.openapi_spec import assert_valid

URL = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
INTERVAL = 0.05
WAIT = INTERVAL * 6  # the model's silence: several keep-alive intervals


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


class SlowBackend:
    """Plans for `plan_s` (or fails planning), says "accepted" ([]), waits `wait_s` for the model,
    then streams a short reply or raises `fail`."""

    def __init__(self, *, plan_s: float = 0, wait_s: float = WAIT, plan_error: Exception | None = None,
                 fail: Exception | None = None) -> None:
        self.plan_s, self.wait_s, self.plan_error, self.fail = plan_s, wait_s, plan_error, fail
        self.closed = False

    async def stream(self, request, caller):
        await asyncio.sleep(self.plan_s)
        if self.plan_error:
            raise self.plan_error
        try:
            yield []
            await asyncio.sleep(self.wait_s)
            if self.fail:
                raise self.fail
            yield [chunk({"role": "assistant", "content": ""})]
            yield [chunk({"content": "Hello"})]
            yield [chunk({}, "stop")]
        finally:
            self.closed = True

    async def respond(self, request, caller):
        raise AssertionError("not used")


def post(backend: SlowBackend, keepalive_s: float = INTERVAL):
    app = build_http_app(backend, [ModelCard("m")], ServerSettings(stream_keepalive_s=keepalive_s))
    with TestClient(app, raise_server_exceptions=False) as c:
        return c.post(URL, json=BODY)


def blocks(text: str) -> list[str]:
    assert text.endswith("\n\n"), text[-50:]
    return text.split("\n\n")[:-1]


def test_waiting_stream_gets_keepalive_comments_then_its_chunks():
    backend = SlowBackend()
    resp = post(backend)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    got = blocks(resp.text)
    n_ticks = got.index(next(b for b in got if b.startswith("data: ")))
    assert n_ticks >= 2 and got[:n_ticks] == [": keep-alive"] * n_ticks, got
    data = got[n_ticks:]
    assert all(b.startswith("data: ") for b in data), "no comment between chunks that flow"
    events = [json.loads(b[6:]) for b in data[:-1]]
    for e in events:
        assert_valid("CreateChatCompletionStreamResponse", e)
    assert [e["choices"][0]["delta"] for e in events] == [{"role": "assistant", "content": ""},
                                                          {"content": "Hello"}, {}]
    assert data[-1] == "data: [DONE]"
    assert backend.closed


def test_slow_planning_error_is_still_an_http_error():
    """Planning is never raced: the client's errors come before any header, however long it takes."""
    resp = post(SlowBackend(plan_s=WAIT, plan_error=invalid_request("bad tools", param="tools")))
    assert resp.status_code == 400
    body = resp.json()
    assert_valid("ErrorResponse", body)
    assert body["error"]["param"] == "tools"


def test_model_error_within_the_grace_keeps_its_status():
    resp = post(SlowBackend(wait_s=0, fail=context_length_exceeded(1024, 2000, None)), keepalive_s=5)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_error_after_the_headers_is_an_sse_error_event():
    resp = post(SlowBackend(fail=context_length_exceeded(1024, 2000, None)))
    assert resp.status_code == 200
    got = blocks(resp.text)
    assert got[0] == ": keep-alive"
    assert got[-1] == "data: [DONE]"
    err = json.loads(got[-2][6:])
    assert_valid("ErrorResponse", err)
    assert err["error"]["code"] == "context_length_exceeded"
    assert all(b == ": keep-alive" for b in got[:-2])


@pytest.mark.parametrize("keepalive_s", [0, 5])
def test_no_comments_when_off_or_when_data_flows_sooner(keepalive_s):
    resp = post(SlowBackend(), keepalive_s=keepalive_s)
    assert resp.status_code == 200
    assert all(b.startswith("data: ") for b in blocks(resp.text))
