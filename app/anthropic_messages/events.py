"""A streamed reply (the generation core's reply events, one choice) as Anthropic's stream events.

    message_start
    (content_block_start, content_block_delta*, content_block_stop)*   one block open at a time
    message_delta (stop_reason, usage), message_stop

The core's deltas say what kind of text each piece is (`reasoning_content`, `content`, a tool call's header
then its argument fragments); a change of kind, or a new call, closes the open block and opens the next.
A call's arguments go out as `input_json_delta`s as they are generated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..generation.reading import Closed, Delta, ReplyEvent
from .shaping import Totals, delta_usage, message, stop_reason, text_block, thinking_block, tool_use_block, usage


class MessageEvents:
    """The events of one streamed message. `totals()` says what the engine has counted so far (read when
    the message starts and when it ends)."""

    def __init__(self, message_id: str, model: str, totals: Callable[[], Totals]) -> None:
        self.message_id = message_id
        self.model = model
        self.totals = totals
        self.started = False
        self.stopped = False
        self.index = -1          # the open block's index (-1: none open yet)
        self.open: str | None = None  # its kind: "thinking", "text", or "tool_use:<chat call index>"

    def feed(self, event: ReplyEvent) -> list[dict[str, Any]]:
        """The events one reply event makes (the first starts the message)."""
        out: list[dict[str, Any]] = []
        if not self.started:
            out += self.start()
        if isinstance(event, Delta):
            delta = event.delta
            if delta.get("reasoning_content"):
                out += self._text("thinking", delta["reasoning_content"])
            if delta.get("content"):
                out += self._text("text", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
        elif isinstance(event, Closed) and event.finish_reason is not None:
            out += self.finish(event.finish_reason)
        return out

    def start(self) -> list[dict[str, Any]]:
        self.started = True
        return [{"type": "message_start",
                 "message": message(self.message_id, self.model, [], None, None, usage(self.totals(), 0))}]

    def finish(self, finish_reason: str) -> list[dict[str, Any]]:
        if self.stopped:
            return []
        self.stopped = True
        totals = self.totals()
        stop = stop_reason(finish_reason, totals.stop_sequence)
        return [*self._close(), {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": totals.stop_sequence if stop == "stop_sequence" else None,
                      "stop_details": None, "container": None},
            "usage": delta_usage(totals)}, {"type": "message_stop"}]

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        out = []
        if self.open != kind:
            out += self._open(kind, thinking_block() if kind == "thinking" else text_block())
        delta = {"type": f"{kind}_delta", kind: text}  # thinking_delta / text_delta
        out.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        kind = f"tool_use:{call.get('index', 0)}"
        fn = call.get("function") or {}
        if call.get("id") is not None:  # a call's header: its own block, input streamed after it
            out += self._open(kind, tool_use_block(call["id"], fn.get("name", ""), {}))
        if fn.get("arguments") and self.open == kind:
            out.append({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        self.index += 1
        self.open = kind
        return [*out, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]
