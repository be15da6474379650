"""JSON schema `pattern`s: a regex subset -> GBNF for the inside of a JSON string (its escaped text)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .gbnf_writer import (
    ASCII,
    FULL,
    RAW,
    Ranges,
    complement,
    contains,
    gbnf_class,
    gbnf_literal,
    intersect,
    json_char,
    normalize,
    quantifier,
)
from .schema_budget import SchemaError, where

if TYPE_CHECKING:
    from .schema_budget import RuleBudget

SHORTHANDS = {"d": ((0x30, 0x39),), "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
              "s": ((0x09, 0x0D), (0x20, 0x20))}
CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


class PatternConverter:
    """A regex subset -> GBNF for the inside of a JSON string (its escaped text)."""

    def __init__(self, conv: RuleBudget, source: str, name: str, path: str) -> None:
        self.conv, self.src, self.name, self.path = conv, source, name, path
        self.pos = 0

    def fail(self, why: str) -> SchemaError:
        shown = self.src if len(self.src) <= 60 else self.src[:57] + "..."
        return SchemaError(f"pattern {shown!r} at {where(self.path)} is not supported: {why}")

    def peek(self, text: str) -> bool:
        return self.src.startswith(text, self.pos)

    def convert(self) -> str:
        branches = []
        while True:
            anchored = self.peek("^")
            self.pos += anchored
            items, anchored_end = self.sequence(top=True, depth=1)
            if not (anchored and anchored_end):  # JSON schema patterns search: any text around
                self.conv.prim("char")
            parts = ([] if anchored else ["char*"]) + [self.join(items)] + ([] if anchored_end else ["char*"])
            branches.append(" ".join(parts))
            if not self.peek("|"):
                break
            self.pos += 1
        if self.pos != len(self.src):
            raise self.fail("unbalanced parenthesis")
        return " | ".join(f"({b})" for b in branches)

    def alternation(self, depth: int) -> str:
        if depth > self.conv.limits.max_depth:
            raise SchemaError(f"pattern group depth {depth} at {where(self.path)} exceeds the limit of "
                              f"{self.conv.limits.max_depth}")
        branches = [self.join(self.sequence(top=False, depth=depth)[0])]
        while self.peek("|"):
            self.pos += 1
            branches.append(self.join(self.sequence(top=False, depth=depth)[0]))
        return " | ".join(branches)

    def sequence(self, top: bool, depth: int) -> tuple[list[tuple[str, bool]], bool]:
        """Items up to `|`, `)` or the end: (GBNF or, when literal, JSON text; is literal)."""
        items: list[tuple[str, bool]] = []
        while self.pos < len(self.src) and self.src[self.pos] not in "|)":
            c = self.src[self.pos]
            if c == "$":
                self.pos += 1
                if top and (self.pos == len(self.src) or self.peek("|")):
                    return items, True
                raise self.fail("'$' only at the end")
            if c == "^":
                raise self.fail("'^' only at the start")
            items.append(self.quantified(self.atom(depth)))
        return items, False

    def join(self, items: list[tuple[str, bool]]) -> str:
        out: list[str] = []
        text = ""
        for item, literal in items:
            if literal:
                text += item
                continue
            if text:
                out.append(gbnf_literal(text))
                text = ""
            out.append(item)
        if text or not out:
            out.append(gbnf_literal(text))
        return " ".join(out)

    def atom(self, depth: int) -> tuple[str, bool]:
        c = self.src[self.pos]
        if c == "(":
            self.pos += 1
            if self.peek("?"):
                if not self.peek("?:"):
                    raise self.fail("only (?: groups")
                self.pos += 2
            inner = self.alternation(depth + 1)
            if not self.peek(")"):
                raise self.fail("unbalanced parenthesis")
            self.pos += 1
            return f"({inner})", False
        if c == "[":
            return self.char_class(), False
        if c == ".":
            self.pos += 1
            return self.charset(complement(((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)), FULL), False), False
        if c == "\\":
            return self.escape()
        if c in "*+?{":
            raise self.fail(f"nothing to repeat at '{c}'")
        self.pos += 1
        return self.literal(c), True

    def literal(self, ch: str) -> str:
        try:
            return json_char(ch)
        except ValueError:
            raise self.fail("surrogate code points") from None

    def escape(self) -> tuple[str, bool]:
        if self.pos + 1 >= len(self.src):
            raise self.fail("trailing backslash")
        c = self.src[self.pos + 1]
        if c in "dwsDWS":
            self.pos += 2
            return self.shorthand(c), False
        code = self.escaped_code(in_class=False)
        return self.literal(chr(code)), True

    def shorthand(self, c: str) -> str:
        if c.islower():
            return self.charset(SHORTHANDS[c], with_controls=True)
        # Python's \D \W \S are Unicode-aware: their ASCII part is safe under both regex flavours
        return self.charset(complement(SHORTHANDS[c.lower()], ASCII), with_controls=False)

    def escaped_code(self, in_class: bool) -> int:
        """The code point of the escape at pos (a backslash), moving past it."""
        c = self.src[self.pos + 1]
        self.pos += 2
        if c in CONTROL_ESCAPES:
            return ord(CONTROL_ESCAPES[c])
        if c == "b" and in_class:
            return 0x08
        if c == "0" and not self.src[self.pos:self.pos + 1].isdigit():
            return 0
        if c in "xu":
            width = 2 if c == "x" else 4
            digits = self.src[self.pos:self.pos + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise self.fail(f"bad \\{c} escape")
            self.pos += width
            return int(digits, 16)
        if c.isascii() and not c.isalnum():
            return ord(c)
        raise self.fail(f"escape \\{c}")

    def quantified(self, atom: tuple[str, bool]) -> tuple[str, bool]:
        bounds = self.bounds()
        if bounds is None:
            return atom
        lo, hi = bounds
        if self.peek("+"):
            raise self.fail("possessive quantifiers")
        self.pos += self.peek("?")  # lazy: same language
        self.conv.spend(hi if hi is not None else lo + 1, "pattern", self.path)
        if hi == 0:
            return '""', False
        text, literal = atom
        if literal:
            text = gbnf_literal(text)
        elif text.startswith("("):  # a group repeats as one rule: llama.cpp multiplies nested groups
            text = self.conv.add(f"{self.name}-part", text[1:-1], self.path)
        return text + quantifier(lo, hi), False

    def bounds(self) -> tuple[int, int | None] | None:
        if self.pos >= len(self.src):
            return None
        c = self.src[self.pos]
        if c in "*+?":
            self.pos += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if c != "{":
            return None
        found = re.compile(r"\{(\d+)(,(\d*))?\}").match(self.src, self.pos)
        if not found:
            raise self.fail("'{' that is not a {m}, {m,} or {m,n} repetition")
        self.pos = found.end()
        lo = int(found.group(1))
        hi = lo if found.group(2) is None else int(found.group(3)) if found.group(3) else None
        limit = self.conv.limits.max_repetition
        for value in (lo, hi):
            if value is not None and value > limit:
                raise SchemaError(f"pattern repetition {value} at {where(self.path)} exceeds the limit of {limit}")
        if hi is not None and hi < lo:
            raise self.fail("repetition {m,n} with n < m")
        return lo, hi

    def char_class(self) -> str:
        self.pos += 1
        negated = self.peek("^")
        self.pos += negated
        if self.peek("]"):
            raise self.fail("empty or ']'-first character class")
        ranges: list[tuple[int, int]] = []
        shorthand = False
        while self.pos < len(self.src) and not self.peek("]"):
            if self.peek("\\") and self.src[self.pos + 1:self.pos + 2] in ("d", "w", "s"):
                ranges.extend(SHORTHANDS[self.src[self.pos + 1]])
                shorthand = True
                self.pos += 2
                continue
            lo = self.class_atom()
            hi = lo
            if self.peek("-") and self.pos + 1 < len(self.src) and self.src[self.pos + 1] != "]":
                self.pos += 1
                hi = self.class_atom()
                if hi < lo:
                    raise self.fail("range out of order in a character class")
            ranges.append((lo, hi))
        if self.pos >= len(self.src):
            raise self.fail("unterminated character class")
        self.pos += 1
        if not negated:
            return self.charset(normalize(ranges), with_controls=True)
        # a negated class holding \d, \w or \s is Unicode-aware in Python: stay within ASCII
        return self.charset(complement(tuple(ranges), ASCII if shorthand else FULL), with_controls=False)

    def class_atom(self) -> int:
        if self.peek("\\"):
            if self.pos + 1 >= len(self.src):
                raise self.fail("trailing backslash")
            if self.src[self.pos + 1] in "DWS":
                raise self.fail("\\D, \\W or \\S inside a character class")
            return self.escaped_code(in_class=True)
        self.pos += 1
        return ord(self.src[self.pos - 1])

    def charset(self, ranges: Ranges, with_controls: bool) -> str:
        """GBNF for one character from `ranges`, as a JSON string writes it. Control characters
        (escaped) only when the class names them: dropping some is fine, a subset stays valid."""
        alts = []
        raw = intersect(ranges, RAW)
        if raw:
            alts.append(gbnf_class(raw))
        for code in (0x22, 0x5C, *range(0x20), 0x7F):
            is_control = code not in (0x22, 0x5C)
            if contains(ranges, code) and (with_controls or not is_control):
                alts.append(gbnf_literal(json_char(chr(code))))
        if not alts:
            raise self.fail("a character class no JSON string character can match")
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
