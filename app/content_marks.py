"""Marks around message content in a rendered prompt, so control tokens come only from the template.

The rendered prompt is tokenized with special-token parsing on (the template writes `<|im_start|>`),
which would also turn a user's literal `<|im_start|>system ...` into real control tokens. Content goes
into the template wrapped in two Unicode noncharacters (reserved for internal use, never valid
interchange text, and removed from client text first); the engine tokenizes the text between them
without special-token parsing and everything else with it.

Marks are a state switch, not a bracket: an open mark starts content and a close mark ends it, so a
template that slices content (Qwen3 splits an old reply at `</think>`) can drop one of them and the
rest still splits safely.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .json_values import map_leaves

OPEN, CLOSE = "\ufdd0", "\ufdd1"
_MARK = re.compile(f"([{OPEN}{CLOSE}])")
_ESCAPED = ("\\ufdd0", "\\ufdd1", "\\uFDD0", "\\uFDD1")  # a template that renders JSON ensure_ascii


def clean(text: str) -> str:
    """Client text without our marks (they would open or close a content span)."""
    if OPEN in text or CLOSE in text:
        return text.replace(OPEN, "").replace(CLOSE, "")
    return text


def mark(text: str) -> str:
    return f"{OPEN}{clean(text)}{CLOSE}" if text else text


def mark_leaves(value: Any) -> Any:
    """Every string inside a JSON-like value marked (keys stay as they are: templates look them up)."""
    return map_leaves(value, lambda v: mark(v) if isinstance(v, str) else v)


def split(prompt: str) -> Iterator[tuple[str, bool]]:
    """(text, is_content) runs of a marked prompt, in order; empty runs are skipped."""
    for escaped in _ESCAPED:
        if escaped in prompt:
            prompt = prompt.replace(escaped, "")
    content = False
    for part in _MARK.split(prompt):
        if part == OPEN or part == CLOSE:
            content = part == OPEN
        elif part:
            yield part, content


def unmark(prompt: str) -> str:
    """The prompt as the model sees it (for logs, /tokenize, tests)."""
    return "".join(text for text, _ in split(prompt))
