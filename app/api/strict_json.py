"""JSON as the server reads and writes it: strict, with finite numbers only, whatever Python's `json` accepts.

Python reads `NaN`, `Infinity` and a number past the float range (`1e999`) as non-finite floats, and writes
them back as bare `NaN`/`Infinity`, which no JSON parser reads. So everything the server parses from a client
or a model goes through `loads` (a non-finite number is a `NonFiniteNumber`, a JSONDecodeError, so callers that
treat unparsable text as text keep doing so), and every body, event, stored entry and prompt fragment is
written by `dumps` (`allow_nan=False`: a non-finite float that got in anyway is a ValueError, never bad JSON).
"""

from __future__ import annotations

import json
import math
from typing import Any

COMPACT = (",", ":")


class NonFiniteNumber(json.JSONDecodeError):
    """A JSON number that is not a finite float: NaN, Infinity, or one that overflows (1e999)."""

    def __init__(self, token: str) -> None:
        self.token = token
        shown = token if len(token) <= 40 else token[:37] + "..."
        message = f"the number {shown} is not finite (NaN, Infinity and numbers past 1.8e308 are not accepted)"
        ValueError.__init__(self, message)
        self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", 0, 1, 1

    def __reduce__(self) -> tuple[Any, ...]:
        return NonFiniteNumber, (self.token,)


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise NonFiniteNumber(token)
    return value


def _constant(name: str) -> Any:
    raise NonFiniteNumber(name)


def loads(text: str | bytes | bytearray) -> Any:
    """Parse JSON whose numbers are all finite (a NonFiniteNumber otherwise)."""
    return json.loads(text, parse_float=_finite, parse_constant=_constant)


# The wire's encoder, made once: json.dumps with options builds a new encoder at each call, a third of the
# cost of a streamed chunk's encoding. No circular check: the server's own dicts and lists never hold themselves
# (one that did would fail as a RecursionError instead of a ValueError, never as bad JSON).
_WIRE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=COMPACT, check_circular=False)


def dumps(value: Any, *, compact: bool = True, ensure_ascii: bool = False, indent: int | None = None,
          sort_keys: bool = False) -> str:
    """`value` as strict JSON text (a ValueError for a non-finite float). `compact`: no spaces after `,` and
    `:` (bodies, events, the store); False keeps json.dumps' own spacing (text shown to a model)."""
    if compact and not ensure_ascii and indent is None and not sort_keys:
        return _WIRE.encode(value)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys, allow_nan=False,
                      separators=COMPACT if compact else None)


def dumps_bytes(value: Any) -> bytes:
    """`value` as compact strict JSON, UTF-8: what goes on the wire and into the store."""
    return _WIRE.encode(value).encode("utf-8")


MAX_DEPTH = 64  # the deepest nesting a request body (or a batch's line) may have


def structure_problem(value: Any, limit: int) -> str | None:
    """What makes a parsed body unusable, checked in one pass: nesting past `limit`, or a string
    holding a lone UTF-16 surrogate (JSON's "\\ud800" escape), which is not text and cannot be encoded."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return "The JSON body contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid text."
            continue
        if isinstance(node, (dict, list)):
            if depth > limit:
                return f"The JSON body is nested too deeply (at most {limit} levels)."
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, str)))
    return None
