"""JSON schema -> GBNF (llama.cpp grammar), safe against hostile schemas.

Our own converter, following the rules of llama.cpp's `common/json-schema-to-grammar.cpp`.
Schemas arrive in requests (`response_format`, tool parameters), so the converter must never
be the thing that takes a replica down, and what the grammar lets a model write must be
RFC 8259 JSON that is valid against the schema. When we cannot be exact we write a *subset*
of the valid documents (fine: the model can always finish), or refuse with `SchemaError`.

Bounded work (`GrammarLimits`, defaults in brackets). Going over any limit is a
`SchemaError` naming the keyword, where it is in the schema and the limit:

- `max_repetition` [1000]: any one count: minLength, maxLength, minItems, maxItems, and
  `{m,n}` in patterns. llama.cpp expands `x{m,n}` into n rules, and bounds over 2000 silently
  become unbounded there.
- `max_total_repetition` [20000]: those counts summed over the whole grammar.
- `max_depth` [32]: schema nesting (through properties, items, anyOf, $ref, ...); also the
  depth of const/enum values and of groups in patterns.
- `max_nodes` [2000]: schema nodes visited (and combined, for allOf).
- `max_grammar_bytes` [256 KiB]: size of the generated grammar.
- `max_enum_values` [1000] and `max_literal_bytes` [16 KiB]: values of one enum/const, and
  their JSON size together.
- `max_name_length` [256]: property names. `max_pattern_length` [1000]: pattern sources.

`$ref` is local only (`#`, `#/$defs/x`, `#/definitions/x`, any `#/` JSON pointer); other
refs are refused, nothing is ever fetched. `#` is the document, or the nearest enclosing
subschema with an `$id` (an embedded resource: tool parameters wrapped in a call schema keep
their own refs that way). Recursive refs become recursive rules; a ref that reaches itself
before any object or array could never be written and is refused.

What a grammar writes:
- whitespace: at most one space (rule `space`), only inside objects and arrays;
- strings: raw characters U+0020..U+10FFFF except `"`, `\\`, DEL and surrogates; escapes
  `\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX` (`\\u` never a surrogate: each written character
  is one code point, so minLength/maxLength are exact);
- numbers: no leading zeros, at most 16 integer digits, 20 fraction digits, 3 exponent
  digits; integers without bounds are within +-(10^16-1);
- integer minimum/maximum/exclusiveMinimum/exclusiveMaximum: exact, by digit ranges (fractional
  bounds round inwards; draft-4 boolean exclusive bounds too);
- number bounds: honoured by writing only plain decimals (no exponent) whose integer part keeps
  them in range; fractional bounds round inwards to integers;
- objects: properties in declaration order (`prop_order` first), required ones always; with
  `properties` but no `additionalProperties`, no other keys (llama.cpp does the same); required
  names missing from `properties` still written; extra keys (after the declared ones) never repeat
  a declared name and are written without escapes, so that what is compared is what decodes;
- arrays: `prefixItems` (or `items` as a list) written in full, then `items`/`additionalItems`
  (none when neither is given, as llama.cpp, unless minItems needs more);
- enum/const: the listed values, filtered by sibling type, bounds and lengths;
- anyOf; oneOf as anyOf (as llama.cpp: exclusivity is not enforced, the one relaxation);
  allOf, `$ref` with siblings and anyOf with siblings by intersecting the schemas keyword by
  keyword (bounds tightened, enums intersected, properties merged, anyOf distributed); parts
  that cannot be combined (two different patterns, say) are refused;
- formats date, time, date-time, uuid; other formats are annotations and ignored (as the spec
  says by default);
- pattern: a regex subset (literals, classes, `.`, `\\d \\w \\s` and their negations, groups,
  `(?:`, `|`, `* + ? {m} {m,} {m,n}`, `^`/`$` at the ends). Unanchored ends accept any text
  there, as JSON schema's search semantics say. Lookarounds, backreferences, `\\b`, flags and
  the like are refused; pattern together with length or format is refused.

Refused (would change validity in ways we cannot enforce): not, if/then/else,
dependentRequired, dependentSchemas, dependencies, patternProperties, propertyNames,
unevaluatedProperties, unevaluatedItems, contains, minContains, maxContains, $dynamicRef,
$recursiveRef; uniqueItems unless maxItems <= 1; multipleOf except 1 on integers;
minProperties/maxProperties unless already implied; enum/const next to structural keywords.
Any other keyword is an annotation (title, description, default, examples, ...) and ignored,
as JSON schema validators do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import unquote

from .json_values import map_leaves


class SchemaError(ValueError):
    """A schema we refuse: over a limit, unsupported, unsatisfiable or malformed."""


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on the work one schema may cause (see the module docstring)."""

    max_repetition: int = 1000
    max_total_repetition: int = 20_000
    max_depth: int = 32
    max_nodes: int = 2000
    max_grammar_bytes: int = 256 * 1024
    max_enum_values: int = 1000
    max_literal_bytes: int = 16 * 1024
    max_name_length: int = 256
    max_pattern_length: int = 1000


DEFAULT_LIMITS = GrammarLimits()

INT_MAX = 10**16 - 1  # the largest integer `integral-part` writes

# name: (body, rules it uses)
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": ('" "?', ()),
    # 4 hex digits that are not a UTF-16 surrogate
    "hex4": ("[0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}", ()),
    # raw characters by positive ranges: llama.cpp decodes any 4-byte form, so a negated class
    # would also let through code points past U+10FFFF and UTF-8-encoded surrogates
    "char": (r'raw-char | "\\" (["\\/bfnrt] | "u" hex4)', ("raw-char", "hex4")),
    "raw-char": (r"[\x20-\x21\x23-\x5B\x5D-\x7E\x80-\uD7FF\uE000-\U0010FFFF]", ()),
    "key-char": ("raw-char", ("raw-char",)),
    "string": (r'"\"" char* "\""', ("char",)),
    "integral-part": ('"0" | [1-9] [0-9]{0,15}', ()),
    "decimal-part": ("[0-9]{1,20}", ()),
    "exponent": ("[eE] [-+]? [0-9]{1,3}", ()),
    "number": ('"-"? integral-part ("." decimal-part)? exponent?', ("integral-part", "decimal-part", "exponent")),
    "integer": ('"-"? integral-part', ("integral-part",)),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": (r'"{" space (string space ":" space value ("," space string space ":" space value)*)? space "}"',
               ("space", "string", "value")),
    "array": (r'"[" space (value ("," space value)*)? space "]"', ("space", "value")),
    "date": ('[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
             '("Z" | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}', ()),
}
# format: (min length, max length) of what its rule writes
FORMATS = {"date": (10, 10), "time": (9, 21), "date-time": (20, 32), "uuid": (36, 36)}
RESERVED = set(PRIMITIVES) | {f"{f}-string" for f in FORMATS} | {"root"}

REFUSED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
           "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains",
           "minContains", "maxContains", "$dynamicRef", "$recursiveRef")
APPLICATORS = ("$ref", "allOf", "anyOf", "oneOf")
FAMILIES = {
    "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
# keywords that decide validity; everything else is an annotation
VALIDATION = ("type", "enum", "const", *APPLICATORS, *REFUSED, *(k for ks in FAMILIES.values() for k in ks))
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
# keywords an enum/const may sit next to: we filter its values by them
ENUM_SIBLINGS = {"type", "enum", "const", "format", *LOWER, *UPPER, "required"}

# code points a JSON string may hold raw: no controls, DEL, quote, backslash or surrogates
RAW = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, 0xD7FF), (0xE000, 0x10FFFF))
FULL = ((0, 0xD7FF), (0xE000, 0x10FFFF))
ASCII = ((0, 0x7F),)
SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
SHORTHANDS = {"d": ((0x30, 0x39),), "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
              "s": ((0x09, 0x0D), (0x20, 0x20))}
CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}

Ranges = tuple[tuple[int, int], ...]


# --- small helpers -----------------------------------------------------------------------

def where(path: str) -> str:
    if len(path) > 160:
        path = path[:60] + "..." + path[-90:]
    return path or "the root"


def join_path(path: str, *segments: str | int) -> str:
    for seg in segments:
        if isinstance(seg, int):
            path += f"[{seg}]"
        else:
            text = seg if re.fullmatch(r"[A-Za-z0-9_$-]{1,40}", seg) else json.dumps(seg[:40])
            path = f"{path}.{text}" if path else text
    return path


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
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def type_fits(value: Any, types: Iterable[str]) -> bool:
    t = json_type(value)
    return t in types or (t == "integer" and "number" in types)


def canonical(value: Any) -> str:
    """Equal JSON values (1 and 1.0, reordered keys) give equal keys."""
    whole = map_leaves(value, lambda v: int(v) if is_number(v) and float(v).is_integer() else v)
    return json.dumps(whole, sort_keys=True)


def is_any(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not any(k in schema for k in VALIDATION))


def keywords(s: dict[str, Any], *leave_out: str) -> dict[str, Any]:
    """The validation keywords of `s`. Looks at those names only, so a schema with a huge
    number of other keys costs no more."""
    return {k: s[k] for k in VALIDATION if k in s and k not in leave_out}


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


# --- patterns ------------------------------------------------------------------------------

class PatternConverter:
    """A regex subset -> GBNF for the inside of a JSON string (its escaped text)."""

    def __init__(self, conv: Converter, source: str, name: str, path: str) -> None:
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


# --- the converter -------------------------------------------------------------------------

MISSING: Any = object()


class Converter:
    """One schema -> GBNF rules. Every visit and every schema combination counts against the
    limits, so the work is bounded whatever the input."""

    def __init__(self, root: Any, limits: GrammarLimits, prop_order: dict[str, int] | None = None) -> None:
        self.limits = limits
        self.prop_order = prop_order or {}
        self.rules: dict[str, str] = {}
        self.by_body: dict[tuple[str, str], str] = {}
        self.counters: dict[str, int] = {}
        self.size = self.nodes = self.repeats = 0
        self.base: tuple[Any, str] = (root, "")  # the resource `#` refers to, and its path
        self.ref_rules: dict[tuple[int, str], str] = {}
        self.unguarded: set[tuple[int, str]] = set()  # refs entered since the last { or [

    # --- rules and budgets

    def store(self, key: str, body: str, path: str) -> None:
        self.size += len(key) + len(body) + 6
        if self.size > self.limits.max_grammar_bytes:
            raise SchemaError(f"grammar size {self.size} bytes at {where(path)} exceeds the limit of "
                              f"{self.limits.max_grammar_bytes} bytes")
        self.rules[key] = body

    def fresh(self, name: str) -> str:
        base = rule_name(name)
        base += "-" if base in RESERVED else ""
        key = base
        while key in self.rules or key in RESERVED:
            n = self.counters.get(base, 0)
            self.counters[base] = n + 1
            key = f"{base}{n}"
        return key

    def add(self, name: str, body: str, path: str) -> str:
        """A rule for `body`, named after `name`; the same body under the same name is shared."""
        known = self.by_body.get((rule_name(name), body))
        if known:
            return known
        key = self.fresh(name)
        self.store(key, body, path)
        self.by_body[(rule_name(name), body)] = key
        return key

    def prim(self, name: str) -> str:
        if name not in self.rules:
            body, deps = PRIMITIVES[name]
            self.store(name, body, "")
            for dep in deps:
                self.prim(dep)
        return name

    def format_rule(self, fmt: str) -> str:
        key = f"{fmt}-string"
        if key not in self.rules:
            self.store(key, rf'"\"" {self.prim(fmt)} "\""', "")
        return key

    def enter(self, path: str, depth: int) -> None:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise SchemaError(f"schema node count {self.nodes} at {where(path)} exceeds the limit of "
                              f"{self.limits.max_nodes}")
        if depth > self.limits.max_depth:
            raise SchemaError(f"schema nesting depth {depth} at {where(path)} exceeds the limit of "
                              f"{self.limits.max_depth}")

    def spend(self, cost: int, keyword: str, path: str) -> None:
        """llama.cpp makes one rule per step of a bounded repetition: keep their total bounded."""
        self.repeats += cost
        if self.repeats > self.limits.max_total_repetition:
            raise SchemaError(f"{keyword} at {where(path)} brings the total repetition count to {self.repeats}, "
                              f"over the limit of {self.limits.max_total_repetition}")

    def repeat(self, rule: str, lo: int, hi: int | None, keyword: str, path: str) -> str:
        if hi == 0:
            return ""
        self.spend(hi if hi is not None else lo + 1, keyword, path)
        return rule + quantifier(lo, hi)

    def format(self) -> str:
        return "\n".join(f"{key} ::= {body}" for key, body in self.rules.items())

    # --- reading keywords

    def natural(self, s: dict[str, Any], kw: str, path: str) -> int | None:
        if kw not in s:
            return None
        v = s[kw]
        if not is_number(v) or v < 0 or not float(v).is_integer():
            raise SchemaError(f"{kw} at {where(path)} must be a non-negative integer")
        return int(v)

    def count(self, s: dict[str, Any], kw: str, path: str) -> int | None:
        """A repetition count (minLength, maxItems, ...), within the limit."""
        v = self.natural(s, kw, path)
        if v is not None and v > self.limits.max_repetition:
            raise SchemaError(f"{kw} {v} at {where(path)} exceeds the limit of {self.limits.max_repetition}")
        return v

    def types(self, s: dict[str, Any], path: str) -> list[str] | None:
        if "type" not in s:
            return None
        t = s["type"]
        ts = [t] if isinstance(t, str) else t
        if not isinstance(ts, list) or not ts or not all(isinstance(x, str) for x in ts):
            raise SchemaError(f"type at {where(path)} must be a type name or a non-empty list of them")
        for x in ts:
            if x not in TYPES:
                raise SchemaError(f"type {x[:40]!r} at {where(path)} is not a JSON schema type")
        return list(dict.fromkeys(ts))

    def listing(self, s: dict[str, Any], kw: str, path: str) -> list[Any]:
        v = s[kw]
        if not isinstance(v, list) or not v:
            raise SchemaError(f"{kw} at {where(path)} must be a non-empty list")
        return v

    def properties(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"properties at {where(path)} must be an object")
        return props

    def required(self, s: dict[str, Any], path: str) -> list[str]:
        req = s.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise SchemaError(f"required at {where(path)} must be a list of property names")
        return list(dict.fromkeys(req))

    def array_items(self, s: dict[str, Any], path: str) -> tuple[list[Any], Any] | None:
        """(prefix item schemas, schema of the items after them or MISSING); None: no item keywords."""
        if "prefixItems" in s:
            prefix, rest = s["prefixItems"], s.get("items", MISSING)
        elif isinstance(s.get("items"), list):
            prefix, rest = s["items"], s.get("additionalItems", MISSING)
        elif "items" in s:
            prefix, rest = [], s["items"]
        else:
            return None
        if not isinstance(prefix, list):
            raise SchemaError(f"prefixItems at {where(path)} must be a list")
        return prefix, rest

    def check_schema(self, s: Any, path: str) -> dict[str, Any]:
        """A dict schema without keywords we refuse."""
        if not isinstance(s, dict):
            raise SchemaError(f"the schema at {where(path)} must be an object or a boolean")
        for kw in REFUSED:
            if kw in s:
                raise SchemaError(f"{kw} at {where(path)} is not supported")
        if s.get("uniqueItems") is True and not (is_number(s.get("maxItems")) and s["maxItems"] <= 1):
            raise SchemaError(f"uniqueItems at {where(path)} is not supported (only with maxItems of at most 1)")
        if "multipleOf" in s and not (is_number(s["multipleOf"]) and s["multipleOf"] == 1
                                      and s.get("type") in ("integer", ["integer"])):
            raise SchemaError(f"multipleOf at {where(path)} is not supported (only 1, on integers)")
        return s

    # --- $ref

    def resolve(self, ref: Any, path: str) -> tuple[Any, str]:
        """The target of a local ref, within the current resource, and its path."""
        if not isinstance(ref, str):
            raise SchemaError(f"$ref at {where(path)} must be a string")
        shown = ref if len(ref) <= 80 else ref[:77] + "..."
        if not ref.startswith("#"):
            raise SchemaError(f"$ref {shown!r} at {where(path)} is not supported: only local references (#/...) are")
        pointer = unquote(ref[1:])
        if pointer and not pointer.startswith("/"):
            raise SchemaError(f"$ref {shown!r} at {where(path)} is not supported: only JSON pointers (#/...) are")
        node, target = self.base
        for token in pointer.split("/")[1:] if pointer else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node, target = node[token], join_path(target, token)
            elif isinstance(node, list) and re.fullmatch(r"[0-9]{1,9}", token) and int(token) < len(node):
                node, target = node[int(token)], join_path(target, int(token))
            else:
                raise SchemaError(f"$ref {shown!r} at {where(path)} points to nothing")
        return node, target

    def ref_rule(self, ref: Any, path: str, depth: int) -> str:
        """The rule for a ref's target, made once; recursion refers back to it."""
        key = (id(self.base[0]), ref if isinstance(ref, str) else "")
        if key in self.unguarded:
            raise SchemaError(f"$ref {str(ref)[:80]!r} at {where(path)} refers to itself before any object or "
                              "array: no value can match it")
        if key in self.ref_rules:
            return self.ref_rules[key]
        target, target_path = self.resolve(ref, path)
        name = self.fresh("ref " + ref.lstrip("#/"))
        self.rules[name] = ""  # reserved: the target may refer back to it
        self.ref_rules[key] = name
        self.unguarded.add(key)
        try:
            body = self.visit(target, name, target_path, depth + 1)
        finally:
            self.unguarded.discard(key)
        self.store(name, body, target_path)
        return name

    def guarded(self, visit: Any, *args: Any) -> Any:
        """Run `visit` after a { or [ was written: a ref reached again from here is recursion."""
        saved, self.unguarded = self.unguarded, set()
        try:
            return visit(*args)
        finally:
            self.unguarded = saved

    # --- visiting

    def visit(self, s: Any, name: str, path: str, depth: int) -> str:
        """The rule (name) for values valid against `s`."""
        self.enter(path, depth)
        if is_any(s):
            return self.prim("value")
        if s is False:
            raise SchemaError(f"the schema at {where(path)} is false: no value can match it")
        s = self.check_schema(s, path)
        if isinstance(s.get("$id"), str) and s is not self.base[0]:
            saved, self.base = self.base, (s, path)  # an embedded resource: `#` is this schema
            try:
                return self.visit_node(s, name, path, depth)
            finally:
                self.base = saved
        return self.visit_node(s, name, path, depth)

    def visit_node(self, s: dict[str, Any], name: str, path: str, depth: int) -> str:
        if "$ref" in s:
            if keywords(s, "$ref"):
                return self.visit(self.flatten(s, path, depth), name, path, depth + 1)
            return self.ref_rule(s["$ref"], path, depth)
        unions = [k for k in ("anyOf", "oneOf") if k in s]
        if "allOf" in s or (unions and (len(unions) > 1 or keywords(s, *unions))):
            return self.visit(self.combine(s, path, depth), name, path, depth + 1)
        if unions:
            return self.visit_union(self.listing(s, unions[0], path), name, join_path(path, unions[0]), depth)
        types = self.types(s, path)
        if "const" in s or "enum" in s:
            return self.visit_enum(s, types, name, path)
        types = types or [t for t, kws in FAMILIES.items() if any(k in s for k in kws)]
        if not types:
            return self.prim("value")
        if len(types) == 1:
            return self.visit_typed(s, types[0], name, path, depth)
        rules = [self.visit_typed(s, t, f"{name}-{t}", path, depth) for t in types]
        return self.add(name, " | ".join(rules), path)

    def visit_union(self, alts: list[Any], name: str, path: str, depth: int) -> str:
        rules = [self.visit(alt, f"{name}-{i}", join_path(path, i), depth + 1)
                 for i, alt in enumerate(alts) if alt is not False]
        if not rules:
            raise SchemaError(f"no alternative at {where(path)} can match a value")
        return self.add(name, " | ".join(rules), path)

    def visit_typed(self, s: dict[str, Any], t: str, name: str, path: str, depth: int) -> str:
        if t == "object":
            return self.visit_object(s, name, path, depth)
        if t == "array":
            return self.visit_array(s, name, path, depth)
        if t == "string":
            return self.visit_string(s, name, path)
        if t in ("integer", "number"):
            return self.visit_numeric(s, t, name, path)
        return self.prim(t)

    # --- enum and const

    def measure(self, values: list[Any], kw: str, path: str) -> None:
        """Bound the size and depth of literal values before anything recursive touches them."""
        limit, size = self.limits.max_literal_bytes, 0
        stack = [(v, 1) for v in values]
        while stack:
            v, d = stack.pop()
            if d > self.limits.max_depth:
                raise SchemaError(f"{kw} value nesting depth {d} at {where(path)} exceeds the limit of "
                                  f"{self.limits.max_depth}")
            if isinstance(v, str):
                size += 2 + (len(v) if len(v) > limit else len(v.encode("utf-8", "surrogatepass")))
            elif isinstance(v, list):
                size += 2 + len(v)
            elif isinstance(v, dict):
                size += 2 + sum(len(str(k)) + 4 for k in v)
            elif isinstance(v, float) and not math.isfinite(v):
                raise SchemaError(f"{kw} at {where(path)} holds a number JSON cannot write")
            elif v is None or isinstance(v, (bool, int, float)):
                size += 8 if not isinstance(v, int) else 2 + v.bit_length() // 3
            else:
                raise SchemaError(f"{kw} at {where(path)} holds a value that is not JSON")
            if size > limit:
                raise SchemaError(f"{kw} of more than {limit} bytes at {where(path)} exceeds the limit of {limit} bytes")
            if isinstance(v, (list, dict)):
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))

    def enum_values(self, s: dict[str, Any], path: str) -> list[Any] | None:
        """The values enum and const allow together; None when neither is there."""
        found = []
        if "enum" in s:
            values = s["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"enum at {where(path)} must be a non-empty list")
            if len(values) > self.limits.max_enum_values:
                raise SchemaError(f"enum with {len(values)} values at {where(path)} exceeds the limit of "
                                  f"{self.limits.max_enum_values}")
            self.measure(values, "enum", path)
            found.append(values)
        if "const" in s:
            self.measure([s["const"]], "const", path)
            found.append([s["const"]])
        if not found:
            return None
        if len(found) == 2:
            keys = {canonical(v) for v in found[1]}
            return [v for v in found[0] if canonical(v) in keys]
        return found[0]

    def visit_enum(self, s: dict[str, Any], types: list[str] | None, name: str, path: str) -> str:
        kw = "const" if "const" in s else "enum"
        for k, v in keywords(s).items():
            if k not in ENUM_SIBLINGS and not is_any(v):  # e.g. additionalProperties: true says nothing
                raise SchemaError(f"{kw} together with {k} at {where(path)} is not supported")
        values = self.enum_values(s, path) or []
        kept = [v for v in values if self.fits(v, types, s, path)]
        if not kept:
            raise SchemaError(f"no value of {kw} at {where(path)} fits the other keywords there")
        literals = dict.fromkeys(gbnf_literal(json_text(v)) for v in kept)
        return self.add(name, " | ".join(literals), path)

    def fits(self, v: Any, types: list[str] | None, s: dict[str, Any], path: str) -> bool:
        """Whether an enum/const value meets the keywords next to it."""
        if types is not None and not type_fits(v, types):
            return False
        if is_number(v):
            lo, lo_x, hi, hi_x = self.bounds(s, path)
            if lo is not None and (v < lo or (lo_x and v == lo)):
                return False
            return hi is None or v < hi or (v == hi and not hi_x)
        sized = {str: ("minLength", "maxLength"), list: ("minItems", "maxItems"),
                 dict: ("minProperties", "maxProperties")}.get(type(v))
        if sized:
            lo, hi = self.natural(s, sized[0], path), self.natural(s, sized[1], path)
            if (lo is not None and len(v) < lo) or (hi is not None and len(v) > hi):
                return False
        return not isinstance(v, dict) or all(r in v for r in self.required(s, path))

    # --- combining schemas (allOf, $ref or anyOf with siblings): their intersection

    def combine(self, s: dict[str, Any], path: str, depth: int) -> Any:
        if "allOf" in s:
            return self.flatten(s, path, depth)
        key = "anyOf" if "anyOf" in s else "oneOf"
        rest = keywords(s, key)
        return self.merge({key: s[key]}, rest, path, depth + 1)

    def flatten(self, s: Any, path: str, depth: int) -> Any:
        """`s` without $ref or allOf at its top: targets and parts merged in."""
        while isinstance(s, dict) and ("$ref" in s or "allOf" in s):
            depth += 1
            self.enter(path, depth)
            if "$ref" in s:
                target, _ = self.resolve(s["$ref"], path)
                s = self.merge(target, keywords(s, "$ref"), path, depth)
                continue
            acc: Any = keywords(s, "allOf")
            for i, part in enumerate(self.listing(s, "allOf", path)):
                acc = self.merge(acc, part, join_path(path, "allOf", i), depth)
            s = acc
        return s

    def merge(self, a: Any, b: Any, path: str, depth: int) -> Any:
        """A schema valid exactly where both are (False: nowhere), or SchemaError if we can't tell."""
        self.enter(path, depth)
        if a is False or b is False:
            return False
        if is_any(a) or is_any(b):
            return b if is_any(a) else a
        if same_ref(a, b):  # left as a ref, so recursive definitions stay recursive rules
            return a
        a = self.flatten(self.check_schema(a, path), path, depth)
        b = self.flatten(self.check_schema(b, path), path, depth)
        if a is False or b is False or is_any(a) or is_any(b):
            return False if a is False or b is False else (b if is_any(a) else a)
        for x, y in ((a, b), (b, a)):
            for key in ("anyOf", "oneOf"):
                if key in x:
                    return self.merge_union(x, key, y, path, depth)
        return self.merge_plain(a, b, path, depth)

    def merge_union(self, x: dict[str, Any], key: str, y: Any, path: str, depth: int) -> Any:
        base = self.merge(keywords(x, key), y, path, depth + 1)
        alts = [self.merge(base, alt, join_path(path, key, i), depth + 1)
                for i, alt in enumerate(self.listing(x, key, path))]
        alts = [alt for alt in alts if alt is not False]
        if not alts:
            return False
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def merge_plain(self, a: dict[str, Any], b: dict[str, Any], path: str, depth: int) -> Any:
        out: dict[str, Any] = {}
        if not self.merge_types(a, b, out, path) or not self.merge_enum(a, b, out, path):
            return False
        self.merge_object(a, b, out, path, depth)
        self.merge_array(a, b, out, path, depth)
        self.merge_bounds(a, b, out, path)
        done = {"type", "enum", "const", "properties", "additionalProperties", "required", "prefixItems", "items",
                "additionalItems", *LOWER, *UPPER}
        for k in VALIDATION:
            if k in done or (k not in a and k not in b):
                continue
            va, vb = a.get(k, MISSING), b.get(k, MISSING)
            if k == "format":  # an unknown format is an annotation: a known one decides
                known = {v for v in (va, vb) if isinstance(v, str) and v in FORMATS}
                if len(known) > 1:
                    raise SchemaError(f"format differs between the schemas combined at {where(path)}")
                out[k] = known.pop() if known else (vb if va is MISSING else va)
                continue
            if va is not MISSING and vb is not MISSING and va != vb:
                raise SchemaError(f"{k} differs between the schemas combined at {where(path)}")
            out[k] = vb if va is MISSING else va
        return out

    def merge_types(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> bool:
        ta, tb = self.types(a, path), self.types(b, path)
        if ta is None or tb is None:
            if ta or tb:
                out["type"] = ta or tb
            return True
        both = [t for t in TYPES if type_fits_name(t, ta) and type_fits_name(t, tb)]
        if "number" in both:
            both.remove("integer")
        out["type"] = both
        return bool(both)

    def merge_enum(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> bool:
        va, vb = self.enum_values(a, path), self.enum_values(b, path)
        if va is None or vb is None:
            if va is not None or vb is not None:
                out["enum"] = va if va is not None else vb
            return va != [] and vb != []
        keys = {canonical(v) for v in vb}
        out["enum"] = [v for v in va if canonical(v) in keys]
        return bool(out["enum"])

    def merge_object(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str, depth: int) -> None:
        pa, pb = self.properties(a, path), self.properties(b, path)
        xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
        if "properties" in a or "properties" in b:
            # a name one side does not declare must pass that side's additionalProperties
            out["properties"] = {k: self.merge(pa.get(k, xa), pb.get(k, xb), join_path(path, "properties", k),
                                               depth + 1) for k in dict.fromkeys([*pa, *pb])}
        if "additionalProperties" in a or "additionalProperties" in b:
            out["additionalProperties"] = self.merge(xa, xb, join_path(path, "additionalProperties"), depth + 1)
        required = list(dict.fromkeys([*self.required(a, path), *self.required(b, path)]))
        if required:
            out["required"] = required

    def merge_array(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str, depth: int) -> None:
        na, nb = self.array_items(a, path), self.array_items(b, path)
        if na is None and nb is None:
            return
        prefix, rest = na or nb or ([], MISSING)
        if na is not None and nb is not None:
            (pa, ra), (pb, rb) = na, nb
            at = lambda p, r, i: p[i] if i < len(p) else (True if r is MISSING else r)  # noqa: E731
            prefix = [self.merge(at(pa, ra, i), at(pb, rb, i), join_path(path, "prefixItems", i), depth + 1)
                      for i in range(max(len(pa), len(pb)))]
            rest = MISSING if ra is MISSING and rb is MISSING else self.merge(
                True if ra is MISSING else ra, True if rb is MISSING else rb, join_path(path, "items"), depth + 1)
        if prefix:
            out["prefixItems"] = prefix
        if rest is not MISSING:
            out["items"] = rest

    def merge_bounds(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> None:
        a, b = plain_bounds(a), plain_bounds(b)
        for keys, pick in ((LOWER, max), (UPPER, min)):
            for k in keys:
                values = [x[k] for x in (a, b) if k in x]
                if not all(is_number(v) for v in values):
                    raise SchemaError(f"{k} at {where(path)} must be a number")
                if values:
                    out[k] = pick(values)

    # --- objects

    def visit_object(self, s: dict[str, Any], name: str, path: str, depth: int) -> str:
        declared, required, extra, forbidden = self.object_parts(s, path)
        self.check_property_counts(s, declared, required, extra, path)
        if not declared and not forbidden and extra is True:
            return self.prim("object")
        self.prim("space")
        kvs, extra_kv = self.guarded(self.object_members, declared, extra, forbidden, name, path, depth)
        entries = [(kvs[k], "required" if k in required else "optional") for k, _ in declared]
        entries += [(extra_kv, "extra")] if extra_kv else []
        return self.add(name, self.object_body(entries, name, path), path)

    def object_parts(self, s: dict[str, Any], path: str) -> tuple[list[tuple[str, Any]], set[str], Any, list[str]]:
        """(declared (name, schema) in writing order, required names, additional schema or
        False, forbidden names). Required names not in properties get declared here."""
        props, required = self.properties(s, path), self.required(s, path)
        # with properties but no additionalProperties, write no others (as llama.cpp: a subset)
        extra = s.get("additionalProperties", "properties" not in s)
        if not isinstance(extra, (bool, dict)):
            raise SchemaError(f"additionalProperties at {where(path)} must be a boolean or a schema")
        extra = True if is_any(extra) else extra
        forbidden = [k for k, v in props.items() if v is False]
        declared = [(k, v) for k, v in props.items() if v is not False]
        for r in required:
            if r in forbidden or (r not in props and s.get("additionalProperties") is False):
                raise SchemaError(f"required property {r[:40]!r} at {where(path)} is not allowed by the schema")
            if r not in props:
                declared.append((r, extra if isinstance(extra, dict) else True))
        for k in [*props, *required]:
            if len(k) > self.limits.max_name_length:
                raise SchemaError(f"property name of {len(k)} characters at {where(path)} exceeds the limit of "
                                  f"{self.limits.max_name_length}")
        order = len(self.prop_order)
        declared.sort(key=lambda kv: self.prop_order.get(kv[0], order))
        return declared, set(required), extra, forbidden

    def check_property_counts(self, s: dict[str, Any], declared: list[Any], required: set[str], extra: Any,
                              path: str) -> None:
        lo, hi = self.natural(s, "minProperties", path), self.natural(s, "maxProperties", path)
        if lo is not None and lo > len(required):
            raise SchemaError(f"minProperties at {where(path)} is not supported (only when required lists "
                              "that many properties)")
        if hi is not None and (extra is not False or len(declared) > hi):
            raise SchemaError(f"maxProperties at {where(path)} is not supported (only when no more properties "
                              "than that are allowed)")

    def object_members(self, declared: list[tuple[str, Any]], extra: Any, forbidden: list[str], name: str,
                       path: str, depth: int) -> tuple[dict[str, str], str | None]:
        kvs = {}
        for k, schema in declared:
            value = self.visit(schema, f"{name}-{k}", join_path(path, "properties", k), depth + 1)
            kvs[k] = self.add(f"{name}-{k}-kv", f'{gbnf_literal(json_text(k))} space ":" space {value}', path)
        if extra is False:
            return kvs, None
        value = self.prim("value") if extra is True else self.visit(
            extra, f"{name}-extra-value", join_path(path, "additionalProperties"), depth + 1)
        key = self.add(f"{name}-extra-key", self.key_rule([k for k, _ in declared] + forbidden), path)
        return kvs, self.add(f"{name}-extra-kv", f'{key} space ":" space {value}', path)

    def key_rule(self, names: list[str]) -> str:
        """A key that is none of `names`. Extra keys are written without escapes, so that what
        is written is what it decodes to and can be compared."""
        self.prim("key-char")
        trie: dict[Any, Any] = {}
        for n in names:
            if all(contains(RAW, ord(ch)) for ch in n):  # others cannot be written raw anyway
                node = trie
                for ch in n:
                    node = node.setdefault(ch, {})
                node[None] = True
        return r'"\"" ' + (not_in(trie) if trie else "key-char*") + r' "\""'

    def object_body(self, entries: list[tuple[str, str]], name: str, path: str) -> str:
        """`{` members in order `}`: entries are (kv rule, "required" | "optional" | "extra")."""
        after = first = ""  # rules for the members from here on: once one was written / while none was
        for j in range(len(entries) - 1, -1, -1):
            kv, kind = entries[j]
            tail = f" {after}" if after else ""
            if kind == "extra":
                after_body, first_body = f'("," space {kv})*', f'({kv} ("," space {kv})*)?'
            elif kind == "required":
                after_body, first_body = f'"," space {kv}{tail}', f"{kv}{tail}"
            else:
                after_body = f'("," space {kv})?{tail}'
                first_body = f"{kv}{tail} | {first}" if first else f"({kv}{tail})?"
            first = self.add(f"{name}-first", first_body, path)
            after = self.add(f"{name}-after", after_body, path) if j else ""
        return f'"{{" space {first} space "}}"' if first else '"{" space "}"'

    # --- arrays

    def visit_array(self, s: dict[str, Any], name: str, path: str, depth: int) -> str:
        lo, hi = self.count(s, "minItems", path) or 0, self.count(s, "maxItems", path)
        if hi is not None and lo > hi:
            raise SchemaError(f"minItems {lo} at {where(path)} is more than maxItems {hi}")
        prefix, rest = self.array_items(s, path) or ([], MISSING)
        if False in prefix:  # no item may stand there: the array ends before it
            prefix, rest = prefix[:prefix.index(False)], False
        prefix = prefix if hi is None else prefix[:hi]
        n = len(prefix)
        rest_lo, rest_hi = max(0, lo - n), None if hi is None else hi - n
        if rest is False and rest_lo:
            raise SchemaError(f"minItems {lo} at {where(path)} cannot be met: no more items are allowed")
        if rest is False or (rest is MISSING and prefix):
            rest, rest_hi = True, rest_lo  # closed (a subset when items is missing): only what minItems needs
        rest = True if rest is MISSING else rest
        if not prefix and is_any(rest) and lo == 0 and rest_hi is None:
            return self.prim("array")
        self.prim("space")
        items, item = self.guarded(self.array_members, prefix, rest if rest_hi != 0 else None, name, path, depth)
        return self.add(name, self.array_body(items, item, rest_lo, rest_hi, name, path), path)

    def array_members(self, prefix: list[Any], rest: Any, name: str, path: str, depth: int) -> tuple[list[str], str | None]:
        items = [self.visit(p, f"{name}-{i}", join_path(path, "prefixItems", i), depth + 1) for i, p in enumerate(prefix)]
        item = None if rest is None else self.visit(rest, f"{name}-item", join_path(path, "items"), depth + 1)
        return items, item

    def array_body(self, items: list[str], item: str | None, lo: int, hi: int | None, name: str, path: str) -> str:
        parts = ['"[" space']
        nxt = self.add(f"{name}-next", f'"," space {item}', path) if item else None
        if items:
            parts.append(' "," space '.join(items))
            if nxt:
                parts.append(self.repeat(nxt, lo, hi, "maxItems" if hi is not None else "minItems", path))
        elif item and nxt:
            more = self.repeat(nxt, max(lo - 1, 0), None if hi is None else hi - 1,
                               "maxItems" if hi is not None else "minItems", path)
            seq = f"{item} {more}".strip()
            parts.append(seq if lo > 0 else f"({seq})?")
        parts.append('space "]"' if items or item else '"]"')
        return " ".join(p for p in parts if p)

    # --- strings

    def visit_string(self, s: dict[str, Any], name: str, path: str) -> str:
        lo, hi = self.count(s, "minLength", path) or 0, self.count(s, "maxLength", path)
        if hi is not None and lo > hi:
            raise SchemaError(f"minLength {lo} at {where(path)} is more than maxLength {hi}")
        fmt = s.get("format") if isinstance(s.get("format"), str) and s.get("format") in FORMATS else None
        if "pattern" in s:
            if fmt or lo or hi is not None:
                other = "format" if fmt else "minLength/maxLength"
                raise SchemaError(f"pattern together with {other} at {where(path)} is not supported")
            return self.pattern_rule(s["pattern"], name, path)
        if fmt:
            if lo > FORMATS[fmt][0] or (hi is not None and hi < FORMATS[fmt][1]):
                raise SchemaError(f"format {fmt} together with minLength/maxLength at {where(path)} is not supported")
            return self.format_rule(fmt)
        if lo == 0 and hi is None:
            return self.prim("string")
        if hi == 0:
            return self.add(name, r'"\"\""', path)
        chars = self.repeat(self.prim("char"), lo, hi, "maxLength" if hi is not None else "minLength", path)
        return self.add(name, rf'"\"" {chars} "\""', path)

    def pattern_rule(self, pattern: Any, name: str, path: str) -> str:
        if not isinstance(pattern, str):
            raise SchemaError(f"pattern at {where(path)} must be a string")
        if len(pattern) > self.limits.max_pattern_length:
            raise SchemaError(f"pattern of {len(pattern)} characters at {where(path)} exceeds the limit of "
                              f"{self.limits.max_pattern_length}")
        body = PatternConverter(self, pattern, name, path).convert()
        return self.add(name, rf'"\"" ({body}) "\""', path)

    # --- numbers

    def bounds(self, s: dict[str, Any], path: str) -> tuple[Any, bool, Any, bool]:
        """(lower bound, exclusive?, upper bound, exclusive?); None where there is none."""
        s = plain_bounds(s)
        found = []
        for inc, exc, pick in (("minimum", "exclusiveMinimum", max), ("maximum", "exclusiveMaximum", min)):
            values = []
            for kw, exclusive in ((inc, False), (exc, True)):
                v = s.get(kw)
                if kw in s and (not is_number(v) or (isinstance(v, float) and not math.isfinite(v))):
                    raise SchemaError(f"{kw} at {where(path)} must be a finite number")
                if kw in s:
                    values.append((v, exclusive))
            # the tighter bound wins; on a tie, the exclusive one
            found.extend(pick(values, key=lambda ve: (ve[0], ve[1] if pick is max else not ve[1]))
                         if values else (None, False))
        return found[0], found[1], found[2], found[3]

    def visit_numeric(self, s: dict[str, Any], t: str, name: str, path: str) -> str:
        lo, lo_x, hi, hi_x = self.bounds(s, path)
        if lo is None and hi is None:
            return self.prim(t)
        ilo = -INT_MAX if lo is None else math.floor(lo) + 1 if lo_x else math.ceil(lo)
        ihi = INT_MAX if hi is None else math.ceil(hi) - 1 if hi_x else math.floor(hi)
        ilo, ihi = max(ilo, -INT_MAX), min(ihi, INT_MAX)
        if ilo > ihi:
            rounded = " (number bounds are rounded to integers)" if t == "number" else ""
            raise SchemaError(f"no {t} that can be written fits the bounds at {where(path)}{rounded}")
        body = int_range(ilo, ihi)
        if t == "number":  # plain decimals strictly between two integers in range
            self.prim("decimal-part")
            alts = [f"({body})"]
            if max(ilo, 0) <= ihi - 1:
                alts.append(f'({natural_range(max(ilo, 0), ihi - 1)}) "." decimal-part')
            if max(-ihi, 0) <= -ilo - 1:
                alts.append(f'"-" ({natural_range(max(-ihi, 0), -ilo - 1)}) "." decimal-part')
            body = " | ".join(alts)
        return self.add(name, body, path)


def same_ref(a: Any, b: Any) -> bool:
    return (isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("$ref"), str)
            and a.get("$ref") == b.get("$ref") and not keywords(a, "$ref") and not keywords(b, "$ref"))


def type_fits_name(t: str, types: list[str]) -> bool:
    return t in types or (t == "integer" and "number" in types)


def plain_bounds(s: dict[str, Any]) -> dict[str, Any]:
    """Draft-4 boolean exclusiveMinimum/exclusiveMaximum as the numeric ones of later drafts."""
    if not any(isinstance(s.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
        return s
    out = dict(s)
    for inc, exc in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exc), bool):
            if out.pop(exc) and inc in out:
                out[exc] = out.pop(inc)
    return out


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


def schema_to_rules(schema: Any, rule: str, limits: GrammarLimits | None = None,
                    prop_order: dict[str, int] | None = None) -> str:
    """GBNF rules defining `rule` as JSON valid against `schema` (no root rule).
    Raises SchemaError for schemas refused or over `limits`."""
    if rule in RESERVED or not re.fullmatch(r"[a-zA-Z0-9-]+", rule):
        raise ValueError(f"unusable rule name {rule!r}")
    conv = Converter(schema, limits or DEFAULT_LIMITS, prop_order)
    conv.prim("space")
    conv.rules[rule] = ""  # reserved: no rule made on the way may take the caller's name
    conv.store(rule, conv.visit(schema, rule, "", 1), "")
    return conv.format()
