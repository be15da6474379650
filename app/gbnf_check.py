"""Bounds on a client's GBNF grammar, checked before llama.cpp's parser sees it.

llama.cpp's GBNF parser recurses once per nested group, with no depth limit: 60,000 nested
parentheses overflow the replica's stack. A bounded repetition `x{m,n}` is expanded into copies of
`x`. So the text is scanned here first (one pass, no recursion) for its size, its group nesting and
its repetition bounds; past a limit the client gets a 400 naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import invalid_request

_REPETITION = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


@dataclass(frozen=True)
class GBNFLimits:
    max_bytes: int = 64 * 1024
    max_depth: int = 64
    max_repetition: int = 1000


def _skip_quoted(text: str, i: int, close: str) -> int:
    """Index just past the literal or character class opened at text[i] (escapes honoured)."""
    i += 1
    while i < len(text) and text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _scan(text: str) -> tuple[int, list[str]]:
    """(deepest group nesting, repetition braces) outside literals, classes and comments."""
    depth = deepest = 0
    braces: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i = _skip_quoted(text, i, '"')
            continue
        if ch == "[":
            i = _skip_quoted(text, i, "]")
            continue
        if ch == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        elif ch == "{":
            end = text.find("}", i)
            braces.append(text[i:] if end < 0 else text[i:end + 1])
        i += 1
    return deepest, braces


def check_gbnf(text: str, limits: GBNFLimits, param: str = "grammar") -> None:
    size = len(text.encode("utf-8"))
    if size > limits.max_bytes:
        raise invalid_request(f"`{param}` is {size} bytes; this server accepts grammars of at most "
                              f"{limits.max_bytes} bytes (limits.max_grammar_bytes).", param=param,
                              code="grammar_too_large")
    deepest, braces = _scan(text)
    if deepest > limits.max_depth:
        raise invalid_request(f"`{param}` nests groups {deepest} deep; at most {limits.max_depth} levels are "
                              f"accepted (limits.max_grammar_depth).", param=param, code="grammar_too_complex")
    for brace in braces:
        match = _REPETITION.fullmatch(brace)
        bounds = [int(b) for b in match.groups() if b] if match else []
        if any(b > limits.max_repetition for b in bounds):
            raise invalid_request(f"`{param}` repeats an item {brace}; repetition bounds of at most "
                                  f"{limits.max_repetition} are accepted (limits.max_schema_repetition).",
                                  param=param, code="grammar_too_complex")
