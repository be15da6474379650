"""Mistral tool calls.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}       (v11+ tokenizers)

Each ``[TOOL_CALLS]`` marker starts a region: a JSON list of call objects
(or one call object), or ``name[ARGS]{json object}``. Prose around regions
is content.
"""
from __future__ import annotations

import re

from ...api import strict_json
from .base import Call, ToolParser, calls_from_json

MARK = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")


class MistralToolParser(ToolParser):
    name = "mistral"
    start_marker = MARK

    def _take(self, buf: str, final: bool) -> tuple[int, list[Call] | None] | None:
        rest = buf[len(MARK):].lstrip()
        pos = len(buf) - len(rest)
        if not rest:
            return None if not final else (len(buf), None)
        if rest[0] in "[{":
            got = self._json_at(buf, pos, final)
            self._follow(buf, pos, got[0] if got else len(buf))
            if got is None:
                return None
            end, closed = got
            return end, calls_from_json(buf[pos:end]) if closed else None
        m = _NAME.match(rest)
        if not m:
            return pos, None
        after = rest[m.end():]
        if not final and (not after or (len(after) < len(ARGS) and ARGS.startswith(after))):
            return None  # name or [ARGS] still coming
        if not after.startswith(ARGS):
            return pos + m.end(), None
        pos += m.end() + len(ARGS)
        if pos >= len(buf):
            return None if not final else (len(buf), None)
        if buf[pos] != "{":
            return pos, None
        got = self._json_at(buf, pos, final)
        self._follow(buf, pos, got[0] if got else len(buf), name=m.group())
        if got is None:
            return None
        end, closed = got
        if not closed:
            return end, None
        try:
            args = strict_json.loads(buf[pos:end])
        except ValueError:
            return end, None
        return end, [(m.group(), buf[pos:end])] if isinstance(args, dict) else None
