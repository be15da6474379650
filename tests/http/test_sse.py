"""SSE framing: `data: <json>\\n\\n` events, one error event on failure, exactly one [DONE]."""

from __future__ import annotations

import asyncio
import json

from app.api.errors import APIError, error_body
from app.http.sse import DONE, SSE_HEADERS, encode_event, frame_stream


def collect(events, on_error=lambda exc: {"error": {"message": str(exc)}}) -> bytes:
    async def run():
        return b"".join([piece async for piece in frame_stream(events, on_error)])
    return asyncio.run(run())


def parse(raw: bytes) -> list:
    """Split an SSE body into decoded events ('[DONE]' stays a string)."""
    assert raw.endswith(b"\n\n")
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def batches(*items, fail: BaseException | None = None):
    for item in items:
        await asyncio.sleep(0)
        yield item
    if fail is not None:
        raise fail


def test_encode_event_format():
    raw = encode_event({"a": 1, "b": [1, 2]})
    assert raw == b'data: {"a":1,"b":[1,2]}\n\n'


def test_encode_event_keeps_non_ascii():
    raw = encode_event({"content": "héllo 世界 🙂"})
    assert raw == 'data: {"content":"héllo 世界 🙂"}\n\n'.encode()
    assert b"\\u" not in raw


def test_encode_event_escapes_newlines_inside_json():
    raw = encode_event({"content": "line1\n\nline2"})
    assert raw.count(b"\n\n") == 1 and raw.endswith(b"\n\n")
    assert json.loads(raw[6:]) == {"content": "line1\n\nline2"}


def test_normal_batches_end_with_exactly_one_done():
    raw = collect(batches([{"i": 0}, {"i": 1}], [{"i": 2}]))
    events = parse(raw)
    assert events == [{"i": 0}, {"i": 1}, {"i": 2}, "[DONE]"]
    assert raw.count(DONE) == 1
    assert raw.endswith(DONE)


def test_one_batch_is_one_write():
    async def run():
        return [p async for p in frame_stream(batches([{"i": 0}, {"i": 1}], [{"i": 2}]), lambda e: {})]
    pieces = asyncio.run(run())
    assert len(pieces) == 3  # two batches + [DONE]
    assert pieces[0] == encode_event({"i": 0}) + encode_event({"i": 1})
    assert pieces[-1] == DONE


def test_empty_batches_produce_nothing():
    async def run():
        return [p async for p in frame_stream(batches([], [{"i": 1}], [], []), lambda e: {})]
    pieces = asyncio.run(run())
    assert pieces == [encode_event({"i": 1}), DONE]


def test_no_batches_at_all_is_just_done():
    assert collect(batches()) == DONE


def test_exception_mid_stream_gives_one_error_event_then_done():
    seen = []

    def on_error(exc):
        seen.append(exc)
        return {"error": {"message": f"boom: {exc}", "type": "server_error", "param": None, "code": "x"}}

    boom = RuntimeError("kaput")
    raw = collect(batches([{"i": 0}], [{"i": 1}], fail=boom), on_error)
    events = parse(raw)
    assert events == [
        {"i": 0}, {"i": 1},
        {"error": {"message": "boom: kaput", "type": "server_error", "param": None, "code": "x"}},
        "[DONE]",
    ]
    assert seen == [boom]
    assert raw.count(DONE) == 1


def test_exception_before_any_batch():
    err = APIError("bad", status=400, param="grammar", code="invalid_grammar", type="invalid_request_error")
    raw = collect(batches(fail=err), lambda exc: error_body(exc)[1])
    assert parse(raw) == [{"error": {"message": "bad", "type": "invalid_request_error", "param": "grammar",
                                     "code": "invalid_grammar"}}, "[DONE]"]


def test_sse_headers():
    assert SSE_HEADERS["Cache-Control"] == "no-cache"
    assert SSE_HEADERS["X-Accel-Buffering"] == "no"


def test_typed_events_dialect_names_each_event_and_sends_no_done():
    from app.http.sse import TYPED_EVENTS

    async def go():
        async def src():
            yield [{"type": "response.created", "n": 1}]
            raise RuntimeError("boom")
        return b"".join([p async for p in frame_stream(src(), lambda e: {"type": "error"}, TYPED_EVENTS)])
    raw = asyncio.run(go())
    assert raw == (b'event: response.created\ndata: {"type":"response.created","n":1}\n\n'
                   b'event: error\ndata: {"type":"error"}\n\n')


def test_anthropic_stream_is_kept_alive_by_comments_until_message_start_then_by_pings():
    """Anthropic's stream opens with message_start: a ping before it is refused by strict clients."""
    from app.http.keepalive import TICK
    from app.http.sse import ANTHROPIC_MESSAGES, KEEPALIVE

    async def go():
        async def src():
            yield []  # accepted: planning passed, the model not yet reached
            yield TICK
            yield TICK
            yield [{"type": "message_start"}]
            yield TICK
            yield [{"type": "message_stop"}]
        return [p async for p in frame_stream(src(), lambda e: {"type": "error"}, ANTHROPIC_MESSAGES)]
    parts = asyncio.run(go())
    assert parts[:2] == [KEEPALIVE, KEEPALIVE]
    assert parts[2].startswith(b"event: message_start\n")
    assert parts[3] == ANTHROPIC_MESSAGES.keepalive and parts[3].startswith(b"event: ping\n")
    assert parts[4].startswith(b"event: message_stop\n")
