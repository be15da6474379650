"""GBNF read the way llama.cpp's parser reads it (`llama_grammar_parser` in llama-grammar.cpp, the
build llama-cpp-python 0.3.36 vendors), into a compact model of the rules it would build.

llama.cpp expands repetitions while parsing: `x{m,n}` writes x's elements m times into the rule and
generates n-m rules `x'(i) ::= x x'(i-1) |`, each with another copy of x (`*`, `+`, `?` and `{m,}`:
one rule). A group `( ... )` becomes a rule of its own and only a reference to it is copied. Here
those copies stay symbolic: an inline run of copies is one `Copies` node and the generated rules one
`Chain` node, so the model is linear in the text whatever the bounds, while the element counts are
exactly llama.cpp's. The reader is a loop with an explicit stack of open groups (no recursion), and
it refuses what llama.cpp refuses, at the same places, so that what it accepts is what llama.cpp builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# llama.cpp refuses a lower bound above this and reads an upper bound above it as "no upper bound".
LLAMA_MAX_REPETITION = 2000
# A generated rule's cost beyond its elements, in elements (8 bytes each, held twice while a grammar
# is built): its vector, its entry in the symbol map, and its name, `<rule>_<id>`. Measured: 100k
# generated rules take ~18 MB and ~140 ms to build (~20 elements' worth each); a 1000-character rule
# name makes each ~2 KB.
RULE_COST = 16
ANY_CHAR = ((0, 0xFFFFFFFF),)
LITERAL_KEYS = 1 << 32
Ranges = tuple[tuple[int, int], ...]

_SPACE = re.compile(r"(?:[ \t]++|#[^\r\n]*+)*+")
_SPACE_NL = re.compile(r"(?:[ \t\r\n]++|#[^\r\n]*+)*+")
_NAME = re.compile(r"[a-zA-Z0-9-]+")
_INT = re.compile(r"[0-9]+")
_ESCAPE = r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[tnr\\\"\[\]-])"
_ESCAPE_RE = re.compile(_ESCAPE)
_LITERAL_BODY = re.compile(rf'(?:[^"\\]++|{_ESCAPE})*+')
_CLASS_CHAR = re.compile(rf"{_ESCAPE}|[^\\]", re.DOTALL)
_CLASS_SPAN = re.compile(r"\[(?:[^\]\\]++|\\.)*+\]", re.DOTALL)  # where a class that reads well ends
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_SIMPLE_ESCAPES = {"t": 9, "r": 13, "n": 10}


class GBNFSyntaxError(ValueError):
    """Text llama.cpp's parser refuses; `pos` is where it stops."""

    deepest = 0  # group nesting read until then

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


class GBNFBoundError(ValueError):
    """A repetition bound we refuse, or a rule set past the element budget, found while reading."""

    deepest = 0

    def __init__(self, kind: str, pos: int, **facts: object) -> None:
        super().__init__(kind)
        self.kind = kind
        self.pos = pos
        self.facts = facts


class Term:
    """A terminal: a literal (one element per character), a character class (one element per
    character and range end; reads one character), `.`, or a `<token>`. `chars`: the code points
    its first step takes; for a literal of several characters, its text's key (`literal_key`);
    None for a token (matched by id). `width`: characters it reads."""

    __slots__ = ("elems", "chars", "pos", "width")

    def __init__(self, elems: int, chars: Ranges | None, pos: int, width: int = 1) -> None:
        self.elems, self.chars, self.pos, self.width = elems, chars, pos, width


class Ref:
    """A reference to a rule; to a `Copies` node it stands for the copies themselves, inline."""

    __slots__ = ("node", "elems", "pos")

    def __init__(self, node: Node, pos: int) -> None:
        self.node, self.pos = node, pos
        self.elems = node.count * node.elems if node.kind == "copies" else 1


Item = Term | Ref


@dataclass(eq=False)
class Node:
    """A rule llama.cpp builds (`rule`: named, `group`: a parenthesized group), the rules one
    repetition generates (`chain`: `x'(count) ::= x x'(count-1) |` ... `x'(1) ::= x |`, or one
    `x' ::= x x' |` when unbounded), or `copies`: `count` inline copies of `alts[0]` (not a rule)."""

    kind: str
    owner: str  # the named rule it belongs to (generated rules are named after it)
    pos: int
    index: int  # in Grammar.nodes
    alts: list[list[Item]] = field(default_factory=list)
    count: int = 1
    unbounded: bool = False
    defined: bool = False
    elems: int = 0  # elements of the one copy (copies) or of its alternates (others)

    @property
    def label(self) -> str:
        if self.kind == "rule":
            return f"rule `{self.owner}`"
        return f"a {'group' if self.kind == 'group' else 'repetition'} in rule `{self.owner}`"


@dataclass
class Grammar:
    nodes: list[Node]
    rules: dict[str, Node]
    root: Node
    units: int  # llama.cpp's elements plus RULE_COST (and the name) per rule
    deepest: int  # group nesting


@dataclass
class _Frame:
    node: Node
    nested: bool
    seq: list[Item] = field(default_factory=list)
    seq_elems: int = 0
    last: int = 0  # where the item a repetition applies to starts (llama.cpp's last_sym_start)


def _rule_cost(owner: str) -> int:
    return RULE_COST + (len(owner) + 8) // 8


def _char(text: str, pos: int) -> tuple[int, int]:
    """(code point, end) of the character or escape at `pos` (already checked by a regex)."""
    ch = text[pos]
    if ch != "\\":
        return ord(ch), pos + 1
    kind = text[pos + 1]
    if kind in "xuU":
        width = {"x": 2, "u": 4, "U": 8}[kind]
        return int(text[pos + 2:pos + 2 + width], 16), pos + 2 + width
    return _SIMPLE_ESCAPES.get(kind, ord(kind)), pos + 2


def _decoded_escape(escape: re.Match[str]) -> str:
    code = _char(escape.group(), 0)[0]
    return chr(code) if code <= 0x10FFFF else f"\x00{code}\x00"  # no NUL gets this far: unambiguous


def _complement(ranges: list[tuple[int, int]]) -> Ranges:
    out, lo = [], 0
    for a, b in sorted(ranges):
        if a > lo:
            out.append((lo, a - 1))
        lo = max(lo, b + 1)
    if lo <= ANY_CHAR[0][1]:
        out.append((lo, ANY_CHAR[0][1]))
    return tuple(out)


class _Reader:
    def __init__(self, text: str, max_repetition: int, max_units: int) -> None:
        self.text = text
        self.n = len(text)
        self.max_repetition = max_repetition
        self.max_units = max_units
        self.nodes: list[Node] = []
        self.rules: dict[str, Node] = {}
        self.units = 0
        self.deepest = 0
        self.literals: dict[str, int] = {}
        self.classes: dict[str, tuple[int, Ranges]] = {}  # classes read so far (schema grammars repeat them)

    # -- helpers -----------------------------------------------------------------------------
    def literal_key(self, written: str) -> Ranges:
        """Where a literal of several characters sits in `Term.chars`: one point per distinct text
        (as decoded: `"\\x20"` is `" "`), past the code points. Stacks at different literals part
        within them; stacks at the same literal (or at one-character terminals taking the same
        character) move in step."""
        text = _ESCAPE_RE.sub(_decoded_escape, written) if "\\" in written else written
        key = LITERAL_KEYS + self.literals.setdefault(text, len(self.literals))
        return ((key, key),)

    def fail(self, message: str, pos: int) -> GBNFSyntaxError:
        return GBNFSyntaxError(message, pos)

    def space(self, pos: int, newline_ok: bool) -> int:
        return (_SPACE_NL if newline_ok else _SPACE).match(self.text, pos).end()

    def spend(self, units: int, pos: int) -> None:
        self.units += units
        if self.units > self.max_units:
            raise GBNFBoundError("elements", pos, units=self.units)

    def named(self, name: str, pos: int) -> Node:
        node = self.rules.get(name)
        if node is None:
            node = self.rules[name] = Node("rule", name, pos, len(self.nodes))
            self.nodes.append(node)
            self.spend(_rule_cost(name), pos)
        return node

    def new_node(self, kind: str, owner: str, pos: int) -> Node:
        node = Node(kind, owner, pos, len(self.nodes))
        self.nodes.append(node)
        return node

    def built(self, node: Node, pos: int) -> None:
        """`node`'s alternates are read: llama.cpp adds its rule (elements, one ALT or END each)."""
        node.elems = sum(sum(item.elems for item in alt) for alt in node.alts)
        self.spend(node.elems + len(node.alts), pos)

    # -- the grammar -------------------------------------------------------------------------
    def read(self) -> Grammar:
        text, n = self.text, self.n
        pos = self.space(0, True)
        while pos < n:
            name = _NAME.match(text, pos)
            if not name:
                raise self.fail("expecting a rule name", pos)
            rule = self.named(name.group(), pos)
            pos = self.space(name.end(), False)
            if not text.startswith("::=", pos):
                raise self.fail("expecting `::=`", pos)
            # a redefinition replaces the rule (llama.cpp's add_rule); the old one was still built
            rule.alts, rule.defined, rule.pos = [], True, name.start()
            pos = self.alternates(rule, self.space(pos + 3, True))
            self.built(rule, pos)
            if pos < n and text[pos] == "\r":
                pos += 2 if text.startswith("\r\n", pos) else 1
            elif pos < n and text[pos] == "\n":
                pos += 1
            elif pos < n:
                raise self.fail("expecting a newline or the end", pos)
            pos = self.space(pos, True)
        for name, node in self.rules.items():
            if not node.defined:
                raise self.fail(f"rule `{name}` is used but never defined", node.pos)
        root = self.rules.get("root")
        if root is None:
            raise self.fail("there is no `root` rule", n)
        return Grammar(self.nodes, self.rules, root, self.units, self.deepest)

    def alternates(self, top: Node, pos: int) -> int:
        """Reads `top`'s alternates, and groups within them through an explicit stack."""
        text, n = self.text, self.n
        stack = [_Frame(top, nested=False)]
        while True:
            frame = stack[-1]
            c = text[pos] if pos < n else ""
            if c == '"':
                body = _LITERAL_BODY.match(text, pos + 1)
                end = body.end()
                if end >= n:
                    raise self.fail("unexpected end of input in a literal", end)
                if text[end] != '"':
                    raise self.fail("unknown escape in a literal", end)
                chars = text[pos + 1:end]
                elems = len(_ESCAPE_RE.sub("_", chars)) if "\\" in chars else len(chars)
                frame.last = len(frame.seq)
                if elems:
                    self.add(frame, Term(elems, self.literal_key(chars) if elems > 1 else
                                         ((_char(text, pos + 1)[0],) * 2,), pos, elems))
                pos = self.space(end + 1, frame.nested)
            elif c == "[":
                pos = self.char_class(frame, pos)
            elif c == "<" or c == "!":
                start = pos
                if c == "!":
                    pos += 1
                    if not text.startswith("<", pos):
                        raise self.fail("expecting `<` after `!`", pos)
                if text.startswith("<[", pos):
                    digits = _INT.match(text, pos + 2)
                    if not digits or not text.startswith("]>", digits.end()):
                        raise self.fail("expecting a token id `<[n]>`", pos)
                    end = digits.end() + 2
                else:
                    close = text.find(">", pos + 1)
                    if close < 0:
                        raise self.fail("expecting `>`", pos)
                    end = close + 1
                frame.last = len(frame.seq)
                self.add(frame, Term(1, None, start))
                pos = self.space(end, frame.nested)
            elif c in _WORD:
                name = _NAME.match(text, pos)
                node = self.named(name.group(), pos)
                frame.last = len(frame.seq)
                self.add(frame, Ref(node, pos))
                pos = self.space(name.end(), frame.nested)
            elif c == "(":
                group = self.new_node("group", frame.node.owner, pos)
                stack.append(_Frame(group, nested=True))
                self.deepest = max(self.deepest, len(stack) - 1)
                pos = self.space(pos + 1, True)
            elif c == ".":
                frame.last = len(frame.seq)
                self.add(frame, Term(1, ANY_CHAR, pos))
                pos = self.space(pos + 1, frame.nested)
            elif c == "*" or c == "+" or c == "?":
                self.repeat(frame, pos, 1 if c == "+" else 0, 1 if c == "?" else None)
                pos = self.space(pos + 1, frame.nested)
            elif c == "{":
                pos = self.braces(frame, pos)
            else:
                frame.node.alts.append(frame.seq)
                if c == "|":
                    frame.seq, frame.seq_elems, frame.last = [], 0, 0
                    pos = self.space(pos + 1, True)
                    continue
                if not frame.nested:
                    return pos
                if c != ")":
                    raise self.fail("expecting `)`", pos)
                self.spend(_rule_cost(frame.node.owner), pos)
                self.built(frame.node, pos)
                stack.pop()
                outer = stack[-1]
                outer.last = len(outer.seq)
                self.add(outer, Ref(frame.node, frame.node.pos))
                pos = self.space(pos + 1, outer.nested)

    def add(self, frame: _Frame, item: Item) -> None:
        frame.seq.append(item)
        frame.seq_elems += item.elems

    def char_class(self, frame: _Frame, pos: int) -> int:
        span = _CLASS_SPAN.match(self.text, pos)
        known = self.classes.get(span.group()) if span else None
        if known is None:
            end, elems, chars = self.read_class(pos)
            if span and end == span.end():
                self.classes[span.group()] = (elems, chars)
        else:
            end, (elems, chars) = span.end(), known
        frame.last = len(frame.seq)
        if elems:
            self.add(frame, Term(elems, chars, pos))
        return self.space(end, frame.nested)

    def read_class(self, pos: int) -> tuple[int, int, Ranges]:
        """(end, elements, code points) of the class at `pos`."""
        text, n = self.text, self.n
        p = pos + 1
        negated = text.startswith("^", p)
        p += negated
        ranges: list[tuple[int, int]] = []
        elems = 0
        while True:
            if p >= n:
                raise self.fail("unexpected end of input in a character class", p)
            if text[p] == "]":
                break
            if not _CLASS_CHAR.match(text, p):
                raise self.fail("unknown escape in a character class", p)
            lo, p = _char(text, p)
            elems += 1
            hi = lo
            if p < n and text[p] == "-" and (p + 1 >= n or text[p + 1] != "]"):
                if p + 1 >= n:
                    raise self.fail("unexpected end of input in a character class", p + 1)
                if not _CLASS_CHAR.match(text, p + 1):
                    raise self.fail("unknown escape in a character class", p + 1)
                hi, p = _char(text, p + 1)
                elems += 1
            ranges.append((lo, hi))
        return p + 1, elems, _complement(ranges) if negated else tuple((a, b) for a, b in ranges if a <= b)

    def braces(self, frame: _Frame, pos: int) -> int:
        text = self.text
        start = pos
        p = self.space(pos + 1, frame.nested)
        low = _INT.match(text, p)
        if not low:
            raise self.fail("expecting a number after `{`", p)
        p = self.space(low.end(), frame.nested)
        lo = hi = int(low.group())
        if text.startswith("}", p):
            close = p
        elif text.startswith(",", p):
            p = self.space(p + 1, frame.nested)
            high = _INT.match(text, p)
            hi = int(high.group()) if high else None  # `{m,}`: no upper bound
            if high:
                p = self.space(high.end(), frame.nested)
            if not text.startswith("}", p):
                raise self.fail("expecting `}`", p)
            close = p
        else:
            raise self.fail("expecting `,` or `}`", p)
        written = text[start:close + 1]
        if max(lo, hi or 0) > self.max_repetition:
            raise GBNFBoundError("repetition", start, written=written)
        if hi is not None and hi < lo:
            raise GBNFBoundError("reversed", start, written=written)
        if lo > LLAMA_MAX_REPETITION:
            raise self.fail("a repetition count above llama.cpp's 2000", start)
        if hi is not None and hi > LLAMA_MAX_REPETITION:
            hi = None
        self.repeat(frame, start, lo, hi)
        return self.space(close + 1, frame.nested)

    def repeat(self, frame: _Frame, pos: int, low: int, high: int | None) -> None:
        """llama.cpp's handle_repetitions on the frame's last item, kept symbolic."""
        if frame.last == len(frame.seq):
            raise self.fail("expecting an item before a repetition", pos)
        prev = frame.seq[frame.last:]
        prev_elems = sum(item.elems for item in prev)
        del frame.seq[frame.last:]
        frame.seq_elems -= prev_elems
        owner = frame.node.owner
        if low == 1:
            frame.seq.extend(prev)
        elif low > 1:
            copies = self.new_node("copies", owner, pos)
            copies.alts, copies.count, copies.elems = [prev], low, prev_elems
            frame.seq.append(Ref(copies, pos))
        frame.seq_elems += low * prev_elems
        n_opt = 1 if high is None else high - low
        if n_opt > 0:
            chain = self.new_node("chain", owner, pos)
            chain.alts, chain.count, chain.unbounded, chain.elems = [prev], n_opt, high is None, prev_elems
            refs = n_opt if high is None else n_opt - 1
            self.spend(n_opt * (prev_elems + 2 + _rule_cost(owner)) + refs, pos)
            frame.seq.append(Ref(chain, pos))
            frame.seq_elems += 1
        if frame.seq_elems > self.max_units:
            raise GBNFBoundError("elements", pos, units=frame.seq_elems)


def read_gbnf(text: str, *, max_repetition: int, max_units: int) -> Grammar:
    """The rules llama.cpp would build from `text`. GBNFSyntaxError where llama.cpp's parser
    refuses the text; GBNFBoundError for a repetition bound above `max_repetition`, a reversed
    one, or more than `max_units` elements (and rule costs) in all."""
    reader = _Reader(text, max_repetition, max_units)
    try:
        return reader.read()
    except (GBNFSyntaxError, GBNFBoundError) as exc:
        exc.deepest = reader.deepest
        raise


def line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1
