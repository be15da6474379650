"""GBNF text: literals, character classes, counts, integer ranges by their digits, and the sets of
code points a JSON string may write."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..api import strict_json

# code points a JSON string may hold raw: no controls, DEL, quote, backslash or surrogates
RAW = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, 0xD7FF), (0xE000, 0x10FFFF))
FULL = ((0, 0xD7FF), (0xE000, 0x10FFFF))
ASCII = ((0, 0x7F),)
SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

Ranges = tuple[tuple[int, int], ...]


def rule_name(name: str) -> str:
    """A GBNF rule name from a schema-derived one, short enough to read."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", name)[:60] or "x"


def gbnf_literal(text: str) -> str:
    """`text` as a quoted GBNF literal."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def class_char(code: int) -> str:
    """A code point inside a GBNF character class."""
    if code < 0x80 and chr(code).isalnum():
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def gbnf_class(ranges: Ranges) -> str:
    parts = (class_char(a) if a == b else f"{class_char(a)}-{class_char(b)}" for a, b in ranges)
    return "[" + "".join(parts) + "]"


def json_text(value: Any) -> str:
    """Compact JSON for a const/enum value, UTF-8 safe (lone surrogates as escapes)."""
    text = strict_json.dumps(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = strict_json.dumps(value, ensure_ascii=True)
    return text


def json_char(ch: str) -> str:
    """How a JSON string writes the character `ch`."""
    if ch in SHORT_ESCAPES:
        return SHORT_ESCAPES[ch]
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return f"\\u{code:04x}"
    if 0xD800 <= code <= 0xDFFF:
        raise ValueError("surrogate")
    return ch


def quantifier(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


# --- integer ranges ------------------------------------------------------------------------

def digits_range(lo: str, hi: str) -> str:
    """Same-length digit strings lo <= hi: the strings between them."""
    if lo == hi:
        return f'"{lo}"'
    i = next(k for k in range(len(lo)) if lo[k] != hi[k])
    head = f'"{lo[:i]}" ' if i else ""
    a, b, rest_lo, rest_hi = int(lo[i]), int(hi[i]), lo[i + 1:], hi[i + 1:]
    n = len(rest_lo)
    if n == 0:
        return f"{head}[{a}-{b}]"
    alts = []
    first, last = a, b
    if rest_lo != "0" * n:  # a.. does not start at a000: split it off
        alts.append(f'"{a}" ({digits_range(rest_lo, "9" * n)})')
        first = a + 1
    tail = None
    if rest_hi != "9" * n:
        tail = f'"{b}" ({digits_range("0" * n, rest_hi)})'
        last = b - 1
    if first <= last:
        alts.append(f"[{first}-{last}] [0-9]{{{n}}}")
    if tail:
        alts.append(tail)
    return f"{head}({' | '.join(alts)})"


def natural_range(lo: int, hi: int) -> str:
    """0 <= lo <= hi: their decimal forms, without leading zeros."""
    alts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10**width - 1)
        alts.append(f"({digits_range(str(a), str(b))})")
    return " | ".join(alts)


def int_range(lo: int, hi: int) -> str:
    """lo <= hi: every integer between them, as JSON writes it."""
    alts = []
    if lo < 0:
        alts.append(f'"-" ({natural_range(max(1, -hi), -lo)})')
    if hi >= 0:
        alts.append(f"({natural_range(max(lo, 0), hi)})")
    return " | ".join(alts)


# --- character sets (patterns) -----------------------------------------------------------

def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def intersect(x: Ranges, y: Ranges) -> Ranges:
    out = [(max(a, c), min(b, d)) for a, b in x for c, d in y if max(a, c) <= min(b, d)]
    return normalize(out)


def complement(x: Ranges, universe: Ranges) -> Ranges:
    gaps, start = [], 0
    for a, b in normalize(x):
        if a > start:
            gaps.append((start, a - 1))
        start = b + 1
    if start <= 0x10FFFF:
        gaps.append((start, 0x10FFFF))
    return intersect(tuple(gaps), universe)


def contains(x: Ranges, code: int) -> bool:
    return any(a <= code <= b for a, b in x)


def not_in(node: dict[Any, Any]) -> str:
    """Key text that does not end on a name of the trie `node` (None marks a name's end)."""
    alts = []
    for ch, child in node.items():
        if ch is None:
            continue
        cls = gbnf_class(((ord(ch), ord(ch)),))
        alts.append(f"{cls} ({not_in(child)})" if len(child) > 1 or None not in child else f"{cls} key-char+")
    taken = tuple((ord(ch), ord(ch)) for ch in node if ch is not None)
    alts.append(f"{gbnf_class(complement(taken, RAW))} key-char*")
    body = " | ".join(alts)
    return body if None in node else f"({body})?"
