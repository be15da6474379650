"""Small helpers shared by the streaming parsers.

* ``partial_prefix_len`` - how much of a buffer's end must be held back
  because it may be the beginning of a tag / marker (the engine's stop
  matcher holds back text by the same rule; it lives there, below the parsers).
* ``find_first`` - the earliest complete occurrence of any of several tags.
* ``find_json_end`` / ``JsonEndScanner`` - string-aware end finder for a JSON
  object/array (or a Python list literal when ``python=True``), incremental.
* ``EdgeTrim`` - the "whitespace next to a tag is dropped" rule, applied to a
  stream of text pieces (holds back trailing whitespace until it is known
  whether a tag follows).
* ``StreamMachine`` - feed/finish over a buffer, for parsers that drain it.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..engine.stop import partial_prefix_len

__all__ = ["EdgeTrim", "JsonEndScanner", "StreamMachine", "find_first", "find_json_end", "partial_prefix_len"]

_OPEN = "{["
_CLOSE = "}]"


def find_first(buf: str, tags: Iterable[str], start: int = 0) -> tuple[int, str | None]:
    """Earliest complete occurrence of any tag: ``(index, tag)`` or ``(-1, None)``."""
    best, best_tag = -1, None
    for tag in tags:
        i = buf.find(tag, start)
        if i >= 0 and (best < 0 or i < best):
            best, best_tag = i, tag
    return best, best_tag


class JsonEndScanner:
    """Incremental, string-aware end finder for a JSON value opened at ``start``.

    ``text[start]`` must be ``{`` or ``[``. Brackets inside strings are
    ignored (double-quoted strings; single-quoted too when ``python``),
    backslash escapes are honoured. Bracket kinds are only counted, not
    matched: a mismatched value is rejected later by the real parser.
    ``end(text)`` returns the index just past the closing bracket, or -1 while
    the value is not closed; it resumes where the previous call stopped, so
    a growing buffer is scanned once in all (the text before the scanned
    position must not change between calls). ``stop`` reads only ``text[:stop]``.
    """

    __slots__ = ("start", "_quotes", "_i", "_depth", "_quote", "_end")

    def __init__(self, start: int = 0, *, python: bool = False) -> None:
        self.start = start
        self._quotes = "\"'" if python else '"'
        self._i = start
        self._depth = 0
        self._quote: str | None = None
        self._end = -1

    def end(self, text: str, stop: int | None = None) -> int:
        if self._end >= 0:
            return self._end
        n = len(text) if stop is None else stop
        if self._i == self.start and (self.start >= n or text[self.start] not in _OPEN):
            return -1
        i, depth, quote = self._i, self._depth, self._quote
        while i < n:
            c = text[i]
            if quote is not None:
                if c == "\\":
                    if i + 1 >= n:
                        break  # resume at the backslash once more text came
                    i += 2
                    continue
                if c == quote:
                    quote = None
            elif c in self._quotes:
                quote = c
            elif c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth -= 1
                if depth == 0:
                    self._end = i + 1
                    break
            i += 1
        self._i, self._depth, self._quote = i, depth, quote
        return self._end


def find_json_end(text: str, start: int = 0, *, python: bool = False) -> int:
    """Index just past the bracket closing the JSON value opened at ``text[start]``
    (``{`` or ``[``), or -1 when not closed. See ``JsonEndScanner``."""
    return JsonEndScanner(start, python=python).end(text)


class EdgeTrim:
    """Drops the whitespace on both sides of a cut point (a tag, a tool call).

    ``push`` returns the text that can be emitted now: trailing whitespace is
    held back (``pending``) until non-whitespace follows; ``cut()`` drops the
    held whitespace and the whitespace that comes next. ``flush`` releases
    what is still held at the end of the stream. The output for a text does
    not depend on how the text was split into pieces.
    """

    __slots__ = ("_held", "strip_leading", "separate")

    def __init__(self, strip_leading: bool = False) -> None:
        # Held trailing whitespace, as pieces: a long whitespace run costs O(1) per piece (joined
        # once, when text follows), not a copy of the whole run each time.
        self._held: list[str] = []
        self.strip_leading = strip_leading
        # Set where something was taken out of the middle of the text (a stray tag, a block of
        # another kind): the text on both sides must not join up, or "<th" + "ink>" would become
        # a tag. One space keeps them apart unless whitespace is already there.
        self.separate = False

    @property
    def pending(self) -> str:
        return "".join(self._held)

    def push(self, text: str) -> str:
        if self.strip_leading:
            text = text.lstrip()
            if not text:
                return ""
            self.strip_leading = False
        if self.separate and text:
            if not self._held and not text[0].isspace():
                text = " " + text
            self.separate = False
        body = text.rstrip()
        if not body:
            if text:
                self._held.append(text)
            return ""
        out = "".join(self._held) + body if self._held else body
        self._held = [text[len(body):]] if len(body) < len(text) else []
        return out

    def cut(self) -> None:
        self._held = []
        self.strip_leading = True

    def drop_held(self) -> None:
        self._held = []

    def flush(self) -> str:
        held, self._held = "".join(self._held), []
        return held


class StreamMachine:
    """``feed`` appends to a buffer and drains it; ``finish`` drains what is left, then adds the
    subclass's ``_tail`` (held text released at the end). Nothing may be fed after ``finish``."""

    def __init__(self) -> None:
        self._buf = ""
        self._done = False

    def feed(self, piece: str) -> list:
        if self._done:
            raise RuntimeError("feed() after finish()")
        self._buf += piece
        return self._drain(final=False)

    def finish(self) -> list:
        if self._done:
            return []
        out = self._drain(final=True) + self._tail()
        self._done = True
        return out

    def _drain(self, final: bool) -> list:
        raise NotImplementedError

    def _tail(self) -> list:
        return []
