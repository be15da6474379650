"""Hermes 2 Pro / Qwen2.5 / Qwen3 tool calls.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each block is one call (a block holding a JSON list of call objects gives
several). Blocks may appear anywhere; prose around them is content. A block
is complete at ``</tool_call>``; at the end of the stream a block without
its closing tag is still accepted when its text is a valid call.
"""
from __future__ import annotations

from ..partial import find_json_end, partial_prefix_len
from .base import Call, ToolParser, calls_from_json

START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    start_marker = START

    def _take(self, buf: str, final: bool) -> tuple[int, list[Call] | None] | None:
        # resume the search for END where the previous feed left it
        frm = self._region.get("from", len(START))
        j = buf.find(END, frm)
        if j < 0 and not final:
            self._region["from"] = max(frm, len(buf) - len(END) + 1)
            self._follow_body(buf, len(buf) - partial_prefix_len(buf, (END,)))
            return None
        stop = len(buf) if j < 0 else j
        self._follow_body(buf, stop)
        return (stop if j < 0 else j + len(END)), calls_from_json(buf[len(START):stop].strip())

    def _follow_body(self, buf: str, stop: int) -> None:
        """Stream the block's JSON, read no further than ``stop`` (never into a closing tag)."""
        start = self._region.get("body")
        if start is None:
            rest = buf[len(START):stop]
            lead = len(rest) - len(rest.lstrip())
            if lead == len(rest):
                return  # only whitespace so far
            start = self._region["body"] = len(START) + lead
        self._follow(buf, start, stop)

    def _json_open(self, buf: str) -> bool:
        body = buf[len(START):].lstrip()
        return not body or (body[0] in "{[" and find_json_end(body) < 0)
