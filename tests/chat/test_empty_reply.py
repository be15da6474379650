"""Empty replies (nothing but whitespace): always counted as `empty`; answered as they are by
default, or refused with a 502 `upstream_empty_response` under a model's `empty_reply: error`."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from app.api.errors import APIError, error_body
from app.api.schemas import parse_chat_request
from app.chat import ChatService
from app.engine.events import Finished, Started, Text
from app.observe.request_records import RequestRecord
from tests.support.openapi_spec import assert_valid


class Records:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)


def service(spec, texts: list[str], mode: str) -> tuple[ChatService, Records]:
    """A ChatService over a fake model that says `texts`, then stops."""
    async def open_stream(model_id, gen):
        yield [Started(prompt_tokens=5, cached_tokens=0)]
        for t in texts:
            await asyncio.sleep(0)
            yield [Text(t, 1)]
        yield [Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=len(texts), cached_tokens=0)]

    observer = Records()
    return ChatService([replace(spec, empty_reply=mode)], open_stream, observer=observer), observer


def request(spec, stream: bool):
    return parse_chat_request({"model": spec.id, "messages": [{"role": "user", "content": "hi"}], "stream": stream})


async def drain(svc: ChatService, req) -> tuple[list[dict], BaseException | None]:
    chunks: list[dict] = []
    try:
        async for batch in svc.stream(req):
            chunks.extend(batch)
    except APIError as exc:
        return chunks, exc
    return chunks, None


BLANK = [" ", "\n", "\t "]


@pytest.mark.parametrize("texts", [[], BLANK], ids=["nothing", "whitespace"])
def test_allowed_empty_reply_is_answered_and_counted_empty(bundled_spec, texts):
    svc, obs = service(bundled_spec, texts, "allow")
    body = asyncio.run(svc.complete(request(bundled_spec, False)))
    assert_valid("CreateChatCompletionResponse", body)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert (body["choices"][0]["message"]["content"] or "").strip() == ""
    (rec,) = obs.records
    assert (rec.status, rec.error_code, rec.stream) == ("empty", None, False)
    assert rec.completion_tokens == len(texts)

    chunks, err = asyncio.run(drain(svc, request(bundled_spec, True)))
    assert err is None
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert obs.records[1].status == "empty" and obs.records[1].stream is True


def test_refused_empty_reply_is_a_502(bundled_spec):
    svc, obs = service(bundled_spec, BLANK, "error")
    with pytest.raises(APIError) as info:
        asyncio.run(svc.complete(request(bundled_spec, False)))
    status, body = error_body(info.value)
    assert status == 502
    assert_valid("ErrorResponse", body)
    assert body["error"]["type"] == "server_error"
    assert body["error"]["code"] == "upstream_empty_response"
    assert body["error"]["param"] is None and "empty" in body["error"]["message"]
    (rec,) = obs.records
    assert (rec.status, rec.error_code) == ("empty", "upstream_empty_response")


def test_refused_empty_stream_ends_in_an_error_not_a_final_chunk(bundled_spec):
    svc, obs = service(bundled_spec, BLANK, "error")
    chunks, err = asyncio.run(drain(svc, request(bundled_spec, True)))
    assert isinstance(err, APIError) and err.status == 502 and err.code == "upstream_empty_response"
    assert chunks, "the role chunk and the whitespace went out before the end was known"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).strip() == ""
    (rec,) = obs.records
    assert (rec.status, rec.error_code, rec.stream) == ("empty", "upstream_empty_response", True)


@pytest.mark.parametrize("mode", ["allow", "error"])
def test_a_reply_with_text_is_ok_in_both_modes(bundled_spec, mode):
    svc, obs = service(bundled_spec, [" ", "Hi", " "], mode)
    body = asyncio.run(svc.complete(request(bundled_spec, False)))
    assert body["choices"][0]["message"]["content"].strip() == "Hi"
    chunks, err = asyncio.run(drain(svc, request(bundled_spec, True)))
    assert err is None and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [r.status for r in obs.records] == ["ok", "ok"]
