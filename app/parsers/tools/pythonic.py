"""Pythonic tool calls (Llama 3.2 / Llama 4 pythonic, Olmo).

    [get_weather(city="Paris", days=3), other(x=[1, 2])]

Only a reply that starts (after whitespace) with such a list counts; the
list is parsed with ``ast`` (never evaluated): each element must be a call
of a (dotted) name with keyword arguments whose values are literals
(``ast.literal_eval``). Anything else, e.g. ``[1] See above``, is content.
Text after the list is content.
"""
from __future__ import annotations

import ast
import re

from ...api import strict_json
from .base import Call, ToolParser

_HEAD = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_HEAD_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")

_START, _PROSE = "start", "prose"


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def parse_pythonic(text: str) -> list[Call] | None:
    """``[f(a=1), g(b="x")]`` -> ``[("f", '{"a": 1}'), ("g", '{"b": "x"}')]``, else None."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[Call] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        if name is None:
            return None
        args = {}
        for kw in node.keywords:
            if kw.arg is None:  # **kwargs
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        try:
            calls.append((name, strict_json.dumps(args, compact=False)))
        except (TypeError, ValueError):  # sets, bytes, complex: not JSON
            return None
    return calls


class PythonicToolParser(ToolParser):
    """Calls are held until the list closes, then sent whole: their arguments are the Python
    keywords converted to JSON, not a span of the reply, so there is no raw text to stream."""

    name = "pythonic"

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__(allowed_names)
        self._state = _START

    def _scan(self, buf: str, final: bool) -> tuple[int, int]:
        if self._state == _START:
            s = buf.lstrip()
            if _HEAD.match(s):
                return len(buf) - len(s), 0
            if not final and (not s or _HEAD_PREFIX.fullmatch(s)):
                return -1, len(buf)  # could still become "[name("
            self._state = _PROSE
        return -1, 0

    def _take(self, buf: str, final: bool) -> tuple[int, list[Call] | None] | None:
        got = self._json_at(buf, 0, final, python=True)
        if got is None:
            return None
        end, closed = got
        self._state = _PROSE
        return end, parse_pythonic(buf[:end]) if closed else None
