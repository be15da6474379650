"""How the engine reads a rendered prompt's content marks: the text between an open and a close mark is a
client's and is tokenized without special-token parsing, everything else with it. The renderer that
writes the marks (and why they survive templates) is app/prompt/content_marks.py."""

from __future__ import annotations

import re
from collections.abc import Iterator

# Unicode noncharacters: never valid interchange text, so a client cannot send one (the renderer drops them).
OPEN, CLOSE = "\ufdd0", "\ufdd1"
_MARK = re.compile(f"([{OPEN}{CLOSE}])")


def split(prompt: str) -> Iterator[tuple[str, bool]]:
    """(text, is_content) runs of a marked prompt, in order; empty runs are skipped."""
    content = False
    for part in _MARK.split(prompt):
        if part == OPEN or part == CLOSE:
            content = part == OPEN
        elif part:
            yield part, content
