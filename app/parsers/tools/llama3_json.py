"""Llama 3.1 / 3.2 JSON tool calls.

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

The ``<|python_tag|>`` is optional, ``"arguments"`` is accepted for
``"parameters"``, several calls are separated by ``;``. Only a reply that
*is* a call counts: after leading whitespace it must start with the tag or
``{``, and the first JSON object must be a call object (name + parameters);
otherwise the whole reply is content (JSON-looking prose). After the calls,
text that is not ``;`` + another call is content.
"""
from __future__ import annotations

from .base import Call, ToolParser, calls_from_json

TAG = "<|python_tag|>"

_START, _AFTER_CALL, _PROSE = "start", "after_call", "prose"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__(allowed_names)
        self._state = _START

    def _scan(self, buf: str, final: bool) -> tuple[int, int]:
        if self._state == _PROSE:
            return -1, 0
        s = buf.lstrip()
        lead = len(buf) - len(s)
        if self._state == _START:
            if s.startswith(TAG) or s.startswith("{"):
                return lead, 0
            if not final and TAG.startswith(s):  # only whitespace / a tag prefix yet
                return -1, len(buf)
        else:  # after a call: "; {next call}" may follow
            if s.startswith(";"):
                return lead, 0
            if not final and not s:
                return -1, len(buf)
        self._state = _PROSE
        return -1, 0

    def _take(self, buf: str, final: bool) -> tuple[int, list[Call] | None] | None:
        pos = len(TAG) if buf.startswith(TAG) else 1 if buf.startswith(";") else 0
        rest = buf[pos:].lstrip()
        pos = len(buf) - len(rest)
        if not rest:
            if not final:
                return None
            calls = None
        elif rest[0] != "{":
            calls = None
        else:
            got = self._json_at(buf, pos, final)
            self._follow(buf, pos, got[0] if got else len(buf))
            if got is None:
                return None
            pos, closed = got
            calls = calls_from_json(buf[len(buf) - len(rest):pos], require_args=True) if closed else None
        self._state = _AFTER_CALL if calls or self._claimed else _PROSE
        return max(pos, 1), calls
