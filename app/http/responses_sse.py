"""The Responses API's stream framing, per request: typed events (`event:` lines, no [DONE]), and an `error`
event that ends a stream under way numbered after the last event sent, as the spec's
`ResponseErrorEvent` has it (`code`, `message`, `param`, `sequence_number`)."""

from __future__ import annotations

from typing import Any

from .sse import TYPED_EVENTS, SSEDialect, encode_named_event


class ResponsesStream:
    def __init__(self) -> None:
        self.next_sequence = 0
        self.dialect = SSEDialect(encode=self.encode, keepalive=TYPED_EVENTS.keepalive, done=None)

    def encode(self, event: dict[str, Any]) -> bytes:
        number = event.get("sequence_number")
        if isinstance(number, int):
            self.next_sequence = max(self.next_sequence, number + 1)
        return encode_named_event(event)

    def error_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """The stream's last event, from an OpenAI error body (`{"error": {...}}`)."""
        error = body["error"]
        return {"type": "error", "code": error.get("code"), "message": error["message"], "param": error.get("param"),
                "sequence_number": self.next_sequence}
