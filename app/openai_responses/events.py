"""A streamed reply (the generation core's reply events, one choice) as the Responses API's typed events.

Each output item is opened when its first delta arrives and closed when another kind of delta (or the end)
comes: `response.output_item.added`, then for text and reasoning a content part with its deltas and
`.done`, for a call its argument deltas as generated and `.done`, then `response.output_item.done`. The
stream opens with `response.created` and `response.in_progress` and ends with `response.completed` (or
`response.incomplete`, the reply cut at its token limit) carrying the whole response. Every event has the
next `sequence_number`."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ..generation.reading import Closed, Delta, ReplyEvent
from .shaping import (
    ResponseShaper,
    function_call_item,
    message_item,
    new_id,
    output_text,
    reasoning_item,
)


class ResponseEvents:
    """`usage()`: the reply's usage (chat's names) once it finished."""

    def __init__(self, shaper: ResponseShaper, usage: Callable[[], dict[str, Any]]) -> None:
        self.shaper = shaper
        self.usage = usage
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # items as they stand (closed ones final)
        self.open: dict[str, Any] | None = None  # the item being written
        self.calls: dict[int, dict[str, Any]] = {}  # a chat tool-call index -> its item
        self.final: dict[str, Any] | None = None  # the whole response, once ended

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.shaper.response("in_progress", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, event: ReplyEvent) -> list[dict[str, Any]]:
        """The events of one reply event (of a one-choice reply); its `Closed` ends the response."""
        out = self.start() if self.sequence == 0 else []
        if isinstance(event, Delta):
            delta = event.delta
            if delta.get("reasoning_content"):
                out += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
        elif isinstance(event, Closed) and event.finish_reason is not None:
            out += self.end(event.finish_reason, self.usage())
        return out

    def end(self, finish_reason: str | None, chat_usage: dict[str, Any]) -> list[dict[str, Any]]:
        """The closing events: the open item done, then the whole response."""
        cut = finish_reason == "length"
        out = [] if self.output else self._text("message", "")  # as the whole reply has: an empty message
        out += self._close("incomplete" if cut else "completed")
        self.final = self.shaper.finished(list(self.output), chat_usage, finish_reason)
        kind = "response.incomplete" if self.final["status"] == "incomplete" else "response.completed"
        return out + [self._event(kind, response=self.final)]

    # ---- items --------------------------------------------------------------------------------------

    def _opened(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self.open = item
        # Copies: the item goes on changing while this event waits to be sent.
        return [self._event("response.output_item.added", output_index=len(self.output) - 1,
                            item=copy.deepcopy({**item, "status": "in_progress"}))]

    def _where(self) -> dict[str, Any]:
        """The open item's place: always the last item."""
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != kind:
            out += self._close("completed")
            if kind == "reasoning":
                item, part = reasoning_item(new_id("rs"), ""), {"type": "reasoning_text", "text": ""}
            else:
                item, part = message_item(new_id("msg"), ""), output_text("")
            item["content"] = []
            out += self._opened(item)
            item["content"].append(part)
            out.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                   part=dict(part)))
        self.open["content"][0]["text"] += text
        if not text:
            pass
        elif kind == "reasoning":
            out.append(self._event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text))
        else:
            out.append(self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                   logprobs=[]))
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if index not in self.calls:
            out += self._close("completed")
            item = function_call_item(new_id("fc"), call.get("id") or new_id("call"), fn.get("name") or "", "")
            self.calls[index] = item
            out += self._opened(item)
        item = self.calls[index]
        if item is not self.open:  # a late fragment of an earlier call: kept, no event for a closed item
            item["arguments"] += fn.get("arguments") or ""
            return out
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self._event("response.function_call_arguments.delta", **self._where(), delta=fn["arguments"]))
        return out

    def _close(self, status: str) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        item, where = self.open, self._where()
        self.open = None
        item["status"] = status
        out: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                   arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                out.append(self._event("response.reasoning_text.done", **where, content_index=0, text=part["text"]))
            else:
                out.append(self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                       logprobs=[]))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=dict(part)))
        out.append(self._event("response.output_item.done", output_index=where["output_index"],
                               item=copy.deepcopy(item)))
        return out
