"""Our APIErrors told as Anthropic tells errors: its statuses (529 for overloaded) and error types, every body
valid against Anthropic's ErrorResponse; and the stream framing Anthropic's clients read."""

from __future__ import annotations

import asyncio

import pytest

from app.anthropic_messages.errors import anthropic_error_body
from app.api.errors import (
    APIError, context_length_exceeded, empty_reply, internal_error, invalid_request, model_not_found, not_found,
    overloaded, payload_too_large, service_unavailable, timeout_error, unauthorized,
)
from app.http.keepalive import TICK
from app.http.sse import ANTHROPIC_MESSAGES, frame_stream
from tests.support.anthropic_spec import assert_valid_error


@pytest.mark.parametrize("error, status, kind", [
    (invalid_request("bad", param="x"), 400, "invalid_request_error"),
    (context_length_exceeded(1024, 2000, 10), 400, "invalid_request_error"),
    (unauthorized(), 401, "authentication_error"),
    (APIError("no", status=403, type="invalid_request_error"), 403, "permission_error"),
    (model_not_found("nope"), 404, "not_found_error"),
    (not_found("Unknown path"), 404, "not_found_error"),
    (APIError("Method GET is not allowed", status=405, type="invalid_request_error"), 405, "invalid_request_error"),
    (payload_too_large(10), 413, "request_too_large"),
    (APIError("slow down", status=429, type="rate_limit_error"), 429, "rate_limit_error"),
    (overloaded(), 529, "overloaded_error"),
    (service_unavailable("replica gone", code="replica_unavailable"), 503, "api_error"),
    (empty_reply(), 502, "api_error"),
    (timeout_error(30), 504, "timeout_error"),
    (internal_error(), 500, "api_error"),
    (RuntimeError("secret"), 500, "api_error"),
])
def test_statuses_and_types(error, status, kind):
    got_status, body = anthropic_error_body(error)
    assert (got_status, body["type"], body["error"]["type"]) == (status, "error", kind)
    assert_valid_error(body)
    assert body["request_id"].startswith("req_")
    if isinstance(error, APIError):
        assert body["error"]["message"] == error.message
    else:
        assert "secret" not in body["error"]["message"]


def test_a_wrapped_error_keeps_its_status():
    """Ray re-raises a remote error as a wrapper holding the original in `.cause`."""
    class Wrapper(Exception):
        def __init__(self, cause):
            self.cause = cause
    assert anthropic_error_body(Wrapper(overloaded()))[0] == 529


def test_stream_framing_names_events_pings_and_has_no_done():
    async def events():
        yield [{"type": "message_start", "message": {}}]
        yield TICK
        raise overloaded()

    async def collect():
        return b"".join([part async for part in frame_stream(events(), lambda exc: anthropic_error_body(exc)[1],
                                                             ANTHROPIC_MESSAGES)])

    text = asyncio.run(collect()).decode()
    frames = text.split("\n\n")[:-1]
    assert frames[0] == 'event: message_start\ndata: {"type":"message_start","message":{}}'
    assert frames[1] == 'event: ping\ndata: {"type": "ping"}'
    assert frames[2].startswith('event: error\ndata: {"type":"error","error":{"type":"overloaded_error"')
    assert len(frames) == 3 and "[DONE]" not in text
