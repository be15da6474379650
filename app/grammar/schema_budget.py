"""The limits on the work one schema may cause, and the rules a conversion makes while it spends them:
every rule stored, every schema node visited and every bounded repetition counts."""

from __future__ import annotations

from dataclasses import dataclass

from .gbnf_writer import quantifier, rule_name


class SchemaError(ValueError):
    """A schema we refuse: over a limit, unsupported, unsatisfiable or malformed."""


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on the work one schema may cause (json_schema_grammar.py's docstring says what each bounds)."""

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


def where(path: str) -> str:
    if len(path) > 160:
        path = path[:60] + "..." + path[-90:]
    return path or "the root"


class RuleBudget:
    """The GBNF rules made so far, and the budgets they spend (`GrammarLimits`)."""

    def __init__(self, limits: GrammarLimits) -> None:
        self.limits = limits
        self.rules: dict[str, str] = {}
        self.by_body: dict[tuple[str, str], str] = {}
        self.counters: dict[str, int] = {}
        self.size = self.nodes = self.repeats = 0

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
