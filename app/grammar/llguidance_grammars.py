"""Grammars as llguidance reads them: JSON schemas, Lark with embedded schemas (a forced tool call in its
parser's syntax) and clients' GBNF, converted by llguidance's own converter.

llguidance (an Earley parser over a lazily built lexer, masks in microseconds) bounds the work of every
token by construction (`parser_limits`), so what a grammar may look like is no longer ours to police
stack by stack; what stays ours: the size and nesting of what a client sends, repetition counts (a
`{1000000}` is a request for a reply no `max_tokens` allows), and errors in the protocols' shapes.
A grammar string made here is what `SamplingParams.grammar` carries to the engine.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, unquote

from llguidance import LLMatcher
from llguidance import gbnf_to_lark as gbnf

from ..engine.constraint import LLGuidancePanic, guarded, parser_limits

# At most one space between JSON's tokens (`{"a": 1}`, `{"a":1}`, `{ "a" : 1 }`), never a run of them or a
# newline: a free whitespace rule lets a model pad a reply with newlines until max_tokens. oneOf is read as
# anyOf: exclusivity cannot be enforced while writing, and values matching two branches are rare in tool schemas.
JSON_OPTIONS = {"item_separator": ",", "key_separator": ":", "whitespace_pattern": " ?", "coerce_one_of": True}


class GrammarError(ValueError):
    """A grammar we refuse; `code` is the protocol error's code."""

    def __init__(self, message: str, code: str = "invalid_grammar") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def check(grammar: str, tokenizer: Any = None) -> None:
    """GrammarError when llguidance refuses `grammar` (syntax, unsupported keywords, past its limits)."""
    try:
        error = guarded(LLMatcher.validate_grammar, grammar, tokenizer, limits=parser_limits())
    except LLGuidancePanic as exc:
        raise GrammarError(f"llguidance failed on the grammar ({exc})") from None
    if error:
        raise GrammarError(_first_lines(error))


def from_json_schema(schema: Any) -> str:
    if schema is False:
        raise GrammarError("the schema is false: no value can match it")
    if schema is True:
        schema = {}
    try:
        return guarded(LLMatcher.grammar_from_json_schema, json.dumps(uri_refs(schema)), overrides=JSON_OPTIONS)
    except LLGuidancePanic as exc:
        raise GrammarError(f"llguidance failed on the schema ({exc})") from None
    except ValueError as exc:
        raise GrammarError(f"not a JSON schema: {exc}") from None


def from_lark(lark: str) -> str:
    try:
        return guarded(LLMatcher.grammar_from_lark, lark)
    except LLGuidancePanic as exc:
        raise GrammarError(f"llguidance failed on the grammar ({exc})") from None


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal (JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def lark_json(schema: Any) -> str:
    """A Lark expression matching JSON valid against `schema`, written like `from_json_schema`'s."""
    schema = uri_refs(schema)
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS} if isinstance(schema, dict) else schema)


def uri_refs(value: Any) -> Any:
    """`value` with each local `$ref` percent-encoded as a URI fragment: clients write `#/$defs/a b` (and
    our limits resolve it so), llguidance reads only URI references."""
    if isinstance(value, list):
        return [uri_refs(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: uri_refs(v) for k, v in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = "#" + quote(unquote(ref[1:]), safe="/~!$&'()*+,;=:@")
    return out


# llguidance builds a lexeme's automaton from its text expanded: a literal of 60,000 characters repeated
# 1000 times took minutes and gigabytes for its first mask (10,000 characters: ~10 ms here). A run of text
# a lexeme stands for (a literal times its repetitions, a pattern's atoms times theirs) is bounded by this.
MAX_EXPANSION = 10_000


def from_gbnf(text: str, max_depth: int, max_repetition: int, max_expansion: int = MAX_EXPANSION) -> str:
    """A client's GBNF (llama.cpp's syntax, `root` the start) as llguidance's grammar; GrammarError when
    it is malformed, nests groups deeper than `max_depth`, repeats more than `max_repetition` times, or
    has a terminal part (text only: literals, classes) longer than `max_expansion` characters expanded."""
    depth, repetition = _shape(text)
    if depth > max_depth:
        raise GrammarError(f"The grammar nests groups {depth} deep; at most {max_depth} levels are accepted "
                           f"(limits.max_grammar_depth).", "grammar_too_complex")
    if repetition > max_repetition:
        raise GrammarError(f"The grammar repeats an item {repetition} times; repetition bounds of at most "
                           f"{max_repetition} are accepted (limits.max_schema_repetition).", "grammar_too_complex")
    try:
        lark = _to_lark(_code_points(text), max_expansion)
    except GrammarError:
        raise
    except RecursionError:
        raise GrammarError("The grammar nests too deeply to be read.", "grammar_too_complex") from None
    except Exception as exc:  # noqa: BLE001 - the converter's errors are the client's syntax errors
        raise GrammarError(f"The grammar is not valid GBNF: {_first_lines(str(exc))}") from None
    grammar = from_lark(lark)
    check(grammar)
    return grammar


_ESCAPE = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def _code_points(gbnf: str) -> str:
    r"""`\uXXXX` and `\UXXXXXXXX` escapes written as the characters they name (`\xHH` below 0x80, where the
    character may mean something to GBNF): llguidance's converter (1.9) writes them in a form its regex
    parser refuses. An escaped backslash stays as it is."""
    def one(m: re.Match[str]) -> str:
        if m.group(1) == "\\":
            return m.group(0)
        code = int(m.group(1)[1:], 16)
        if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            raise GrammarError(f"The grammar's escape {m.group(0)} names no character (a surrogate, or past "
                               f"U+10FFFF).")
        return f"\\x{code:02x}" if code < 0x80 else chr(code)
    return _ESCAPE.sub(one, gbnf)


_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _to_lark(text: str, max_expansion: int) -> str:
    """llguidance's converter (parse, resolve, write), with the expansion of each terminal part checked
    between parsing and writing. Each step takes time linear in the grammar's size (a client's grammar is
    prepared on a shared pool, and work that outlives its deadline holds a thread that every key needs)."""
    rules = gbnf.GrammarParser().parse(text)
    order = _mark_terminals(rules)
    gbnf.resolve(rules)  # its own fixpoint now finds every terminal rule marked: one pass
    sizes: dict[int, int] = {}
    for rule in order:  # each after the rules it refers to
        sizes[id(rule)] = _expansion(rule.alternatives, sizes, max_expansion)
    for rule in rules.values():
        _check_expansion(rule.alternatives, max_expansion, rule.name, sizes)
    ordered = sorted(rules.values(), key=lambda r: r.order)
    return "%llguidance {}\n\n" + "\n".join(str(r) + ("\n" if "\n" in str(r) else "") for r in ordered) + "\n"


def _mark_terminals(rules: dict[str, Any]) -> list[Any]:
    """Each rule's references bound and its `rule_is_terminal` set as gbnf.resolve decides it (a rule other than
    root whose references are all to terminal rules), by a worklist over who refers to whom: linear, where
    resolve's own fixpoint walks every rule once per level of a chain of terminal rules (quadratic: a 64 KB
    chain took a second). The terminal rules, each after every rule it refers to."""
    referrers: dict[int, list[Any]] = {}
    waiting: dict[int, int] = {}  # rule -> references to rules not (yet) terminal
    ready = []
    for rule in rules.values():
        refs = [n for n in _nodes(rule.alternatives) if isinstance(n, gbnf.RuleRefNode)]
        for ref in refs:
            if ref.name not in rules:
                raise ValueError(f"Rule '{ref.name}' not found")
            ref.target = rules[ref.name]
            referrers.setdefault(id(ref.target), []).append(rule)
        waiting[id(rule)] = len(refs)
        if not refs and rule.name != "root":
            ready.append(rule)
    order = []
    while ready:
        rule = ready.pop()
        rule.rule_is_terminal = True
        order.append(rule)
        for referrer in referrers.get(id(rule), ()):
            waiting[id(referrer)] -= 1
            if waiting[id(referrer)] == 0 and referrer.name != "root":
                ready.append(referrer)
    return order


def _nodes(node: Any) -> list[Any]:
    """`node` and everything under it (within one rule: as deep as its groups nest)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children())
    return out


def _check_expansion(node: Any, limit: int, rule: str, sizes: dict[int, int]) -> None:
    if node.is_terminal():
        size = _expansion(node, sizes, limit)
        if size > limit:
            raise GrammarError(f"The grammar's rule `{'root' if rule == 'start' else rule}` stands for more than "
                               f"{limit} characters of text repeated out; at most {limit} are accepted in one terminal "
                               f"part (literals and character classes with their repetitions).", "grammar_too_complex")
        return
    for child in node.children():
        _check_expansion(child, limit, rule, sizes)


def _expansion(node: Any, sizes: dict[int, int], limit: int) -> int:
    """Characters a terminal part stands for with its repetitions written out (a class counts one), counted up to
    `limit + 1` at most: a referenced terminal rule counts what `sizes` holds for it (each rule counted once, so
    rules that each refer to the next several times cost their size, not their exponential expansion)."""
    cap = limit + 1
    if isinstance(node, gbnf.LiteralNode):
        return min(cap, max(1, len(node.value)))
    if isinstance(node, gbnf.RuleRefNode):
        return sizes.get(id(node.target), 1) if node.target is not None else 1
    if isinstance(node, gbnf.RepetitionNode):
        times = node.max_times if node.max_times is not None else node.min_times
        return min(cap, _expansion(node.node, sizes, limit) * max(1, times))
    children = node.children()
    return min(cap, sum(_expansion(c, sizes, limit) for c in children)) if children else 1


def pattern_expansion(pattern: str) -> int:
    """What a regex `pattern` stands for written out: each atom (character, class, escape) one, a group the
    sum of its parts, `{m,n}` multiplying the atom or group before it by n (m when unbounded)."""
    stack: list[int] = [0]
    last = 0  # the size of the atom or group just closed, which a quantifier multiplies
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            last = 1
            stack[-1] += 1
            continue
        if c == "[":
            j = i + 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            last = 1
            stack[-1] += 1
            continue
        if c == "(":
            stack.append(0)
        elif c == ")" and len(stack) > 1:
            last = stack.pop()
            stack[-1] += last
        elif c == "{":
            m = _BOUND.match(pattern, i)
            if m:
                low, high = int(m.group(1)), m.group(2)
                times = int(high) if high else low
                stack[-1] += last * (max(1, times) - 1)
                last *= max(1, times)
                i = m.end()
                continue
            stack[-1] += 1
            last = 1
        elif c not in "|^$*+?":
            stack[-1] += 1
            last = 1
        i += 1
    return sum(stack)


def _shape(gbnf: str) -> tuple[int, int]:
    """The deepest group nesting and the largest repetition bound written in `gbnf`, outside its string
    literals, character classes and comments (which may hold parentheses and braces as text)."""
    depth = deepest = 0
    code: list[str] = []
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
            code.append(" ")
        elif c == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        else:
            if c == "(":
                depth += 1
                deepest = max(deepest, depth)
            elif c == ")":
                depth -= 1
            code.append(c)
        i += 1
    bounds = [int(b) for m in _BOUND.finditer("".join(code)) for b in m.groups() if b]
    return deepest, max(bounds, default=0)


def _first_lines(message: str, limit: int = 600) -> str:
    """llguidance's message without the grammar listing it may append."""
    text = message.strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."
