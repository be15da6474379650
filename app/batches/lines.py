"""An input file's lines, read in blocks of bounded size: a line longer than its limit is reported by its number
and skipped to its end without being held (a 200 MB line costs one block of memory), so reading is linear in the
file and bounded in memory whatever it holds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class RawLine:
    number: int  # 1-based, as an editor counts
    offset: int  # where it starts in the file
    data: bytes | None  # its bytes without the newline; None: longer than the limit (`length` says how long)
    length: int


def raw_lines(blocks: Iterable[bytes], max_line_bytes: int) -> Iterator[RawLine]:
    """The lines of a file given as `blocks` of bytes (`\\n` ends a line, a `\\r` before it is dropped; a last
    line without a newline counts). Blank lines are yielded too: the caller decides what they mean."""
    number, start = 0, 0
    parts: list[bytes] = []
    held = 0  # bytes of the current line so far
    over = False
    for block in blocks:
        pos = 0
        while pos < len(block):
            end = block.find(b"\n", pos)
            piece = block[pos:] if end < 0 else block[pos:end]
            held += len(piece)
            if not over:
                if held > max_line_bytes:
                    over, parts = True, []
                else:
                    parts.append(piece)
            if end < 0:
                break
            number += 1
            yield _line(number, start, parts, held, over)
            start += held + 1
            parts, held, over = [], 0, False
            pos = end + 1
    if held or parts:
        number += 1
        yield _line(number, start, parts, held, over)


def _line(number: int, offset: int, parts: list[bytes], length: int, over: bool) -> RawLine:
    if over:
        return RawLine(number, offset, None, length)
    data = b"".join(parts)
    if data.endswith(b"\r"):
        data = data[:-1]
    return RawLine(number, offset, data, length)
