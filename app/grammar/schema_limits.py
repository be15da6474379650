"""What a JSON schema from a request may ask for, checked before llguidance compiles it.

llguidance bounds its own work per token by construction; what stays ours to decide is how large a
schema a client may send and which shapes we refuse outright, in the protocol's error with the place in
the schema named: counts past `max_repetition` (a `maxLength` of 10^9 is a request for a reply no
`max_tokens` allows), deep nesting, huge enums, patterns, remote `$ref`s (nothing is ever fetched) and
`$ref` loops that reach themselves before any object or array (no value can match them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from .llguidance_grammars import MAX_EXPANSION, pattern_expansion


class SchemaError(ValueError):
    """A schema we refuse: over a limit, unsupported, unsatisfiable or malformed."""


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on one schema (the limits table of docs/configuration.md names the request limits they come from)."""

    max_repetition: int = 1000          # any one of minLength, maxLength, minItems, maxItems, min/maxProperties
    max_total_repetition: int = 20_000  # those summed over the schema
    max_depth: int = 32                 # nesting through properties, items, anyOf, $ref, ...
    max_nodes: int = 2000               # subschemas visited
    max_enum_values: int = 1000         # values of one enum
    max_literal_bytes: int = 16 * 1024  # one enum's or const's values as JSON
    max_name_length: int = 256          # a property name
    max_pattern_length: int = 1000      # a pattern's source
    max_merged_nodes: int = 10_000      # subschemas with each $ref under allOf written out (what llguidance merges)


DEFAULT_LIMITS = GrammarLimits()

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
# keywords whose value is one subschema / a list of them / a map of names to them
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
        "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# a value is written inside { or [ past these: a $ref met again from here is recursion, not a loop
_GUARDS = {"properties", "patternProperties", "items", "prefixItems", "additionalProperties", "additionalItems",
           "contains", "unevaluatedProperties", "unevaluatedItems"}


def where(path: str) -> str:
    return path or "the root"


def join_path(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


class _Walk:
    def __init__(self, root: Any, limits: GrammarLimits) -> None:
        self.limits = limits
        self.nodes = 0
        self.total_repetition = 0
        self.bases: list[Any] = [root]      # resources `#` refers to: the root, or a subschema with an $id
        self.unguarded: set[tuple[int, str]] = set()
        self.done: set[tuple[int, str]] = set()

    def visit(self, s: Any, path: str, depth: int) -> None:
        lim = self.limits
        self.nodes += 1
        if self.nodes > lim.max_nodes:
            raise SchemaError(f"the schema has more than {lim.max_nodes} subschemas")
        if isinstance(s, bool):
            return
        if not isinstance(s, dict):
            raise SchemaError(f"the schema at {where(path)} must be an object or a boolean")
        if depth > lim.max_depth:
            raise SchemaError(f"the schema nests deeper than {lim.max_depth} levels at {where(path)}")
        own_base = isinstance(s.get("$id"), str)
        if own_base:
            self.bases.append(s)
        saved = self.unguarded
        try:
            self._check_node(s, path)
            for key in _ONE + _MANY + _MAP:
                if key not in s:
                    continue
                if key in _GUARDS:
                    self.unguarded = set()
                value, at = s[key], join_path(path, key)
                if key in _MAP:
                    if not isinstance(value, dict):
                        raise SchemaError(f"{key} at {where(path)} must be an object")
                    for name, sub in value.items():
                        if len(name) > lim.max_name_length:
                            raise SchemaError(f"property name of {len(name)} characters at {where(at)} exceeds the "
                                              f"limit of {lim.max_name_length}")
                        self.visit(sub, join_path(at, name), depth + 1)
                elif key in _MANY or (key == "items" and isinstance(value, list)):
                    if not isinstance(value, list):
                        raise SchemaError(f"{key} at {where(path)} must be an array")
                    for i, sub in enumerate(value):
                        self.visit(sub, join_path(at, i), depth + 1)
                else:
                    self.visit(value, at, depth + 1)
                self.unguarded = saved
            if "$ref" in s:
                self.follow(s["$ref"], path, depth)
        finally:
            self.unguarded = saved
            if own_base:
                self.bases.pop()

    def _check_node(self, s: dict[str, Any], path: str) -> None:
        lim = self.limits
        for key in _COUNTS:
            if key in s:
                n = s[key]
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise SchemaError(f"{key} at {where(path)} must be a non-negative integer")
                if n > lim.max_repetition:
                    raise SchemaError(f"{key} {n} at {where(path)} exceeds the limit of {lim.max_repetition}")
                self.total_repetition += n
                if self.total_repetition > lim.max_total_repetition:
                    raise SchemaError(f"the schema's repetition counts add up past {lim.max_total_repetition} "
                                      f"(at {where(path)})")
        for lo, hi in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")):
            if isinstance(s.get(lo), int) and isinstance(s.get(hi), int) and s[lo] > s[hi]:
                raise SchemaError(f"{lo} {s[lo]} at {where(path)} is more than {hi} {s[hi]}")
        if "enum" in s:
            values = s["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"enum at {where(path)} must be a non-empty array")
            if len(values) > lim.max_enum_values:
                raise SchemaError(f"enum of {len(values)} values at {where(path)} exceeds the limit of "
                                  f"{lim.max_enum_values}")
        for key in ("enum", "const"):
            if key in s and len(json.dumps(s[key], ensure_ascii=False)) > lim.max_literal_bytes:
                raise SchemaError(f"the values of {key} at {where(path)} exceed {lim.max_literal_bytes} bytes")
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise SchemaError(f"pattern at {where(path)} must be a string")
            if len(s["pattern"]) > lim.max_pattern_length:
                raise SchemaError(f"pattern of {len(s['pattern'])} characters at {where(path)} exceeds the limit "
                                  f"of {lim.max_pattern_length}")
            size = pattern_expansion(s["pattern"])
            if size > MAX_EXPANSION:
                raise SchemaError(f"pattern at {where(path)} stands for up to {size} characters with its "
                                  f"repetitions written out, past the limit of {MAX_EXPANSION}")

    def follow(self, ref: Any, path: str, depth: int) -> None:
        """A local ref's target, visited once per resource; met again before a { or [: a loop."""
        base = self.bases[-1]
        key = (id(base), ref if isinstance(ref, str) else "")
        if key in self.unguarded:
            raise SchemaError(f"$ref {str(ref)[:80]!r} at {where(path)} refers to itself before any object or "
                              "array: no value can match it")
        if key in self.done:  # visited, or being visited (recursion through an object or array)
            return
        target, target_path = self.resolve(ref, path)
        self.done.add(key)
        self.unguarded = self.unguarded | {key}
        self.visit(target, target_path, depth + 1)

    def resolve(self, ref: Any, path: str) -> tuple[Any, str]:
        if not isinstance(ref, str):
            raise SchemaError(f"$ref at {where(path)} must be a string")
        shown = ref if len(ref) <= 80 else ref[:77] + "..."
        if not ref.startswith("#"):
            raise SchemaError(f"$ref {shown!r} at {where(path)} is not supported: only local references (#/...) are")
        pointer = unquote(ref[1:])
        if pointer and not pointer.startswith("/"):
            raise SchemaError(f"$ref {shown!r} at {where(path)} is not supported: only JSON pointers (#/...) are")
        node, target = self.bases[-1], ""
        for token in pointer.split("/")[1:] if pointer else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node, target = node[token], join_path(target, token)
            elif isinstance(node, list) and re.fullmatch(r"[0-9]{1,9}", token) and int(token) < len(node):
                node, target = node[int(token)], join_path(target, int(token))
            else:
                raise SchemaError(f"$ref {shown!r} at {where(path)} points to nothing")
        return node, target


class _Merged:
    """How many subschemas llguidance's compiler builds for a schema: each once, except under `allOf`, whose
    branches it merges into one schema by resolving each `$ref` there, and the `allOf`, `anyOf` and `oneOf` of what
    it resolves, once per path (what sits below a property or an item stays a reference). `$defs` whose `allOf`s
    each name the next one several times stand for exponentially many (4 refs, 12 levels: 16 million, 83 s of
    llguidance's time on a thread no deadline can stop); counted once per (subschema, merged or not) and capped
    at `cap + 1`, this is linear in the schema."""

    def __init__(self, root: Any, cap: int) -> None:
        self.cap = cap
        self.bases: list[Any] = [root]
        self.memo: dict[tuple[int, bool], int] = {}
        self.open: set[tuple[int, bool]] = set()
        self.resolver = _Walk(root, DEFAULT_LIMITS)

    def size(self, s: Any, inlined: bool = False) -> int:
        if not isinstance(s, dict):
            return 1
        key = (id(s), inlined)
        if key in self.memo:
            return self.memo[key]
        if key in self.open:  # recursion: a rule of its own, whatever the path
            return 1
        self.open.add(key)
        own_base = isinstance(s.get("$id"), str)
        if own_base:
            self.bases.append(s)
        total = 1
        try:
            for name in _ONE + _MANY + _MAP:
                value = s.get(name)
                below = name == "allOf" or (inlined and name in ("anyOf", "oneOf"))
                if isinstance(value, dict) and name in _MAP:
                    total += sum(self.size(v, below) for v in value.values())
                elif isinstance(value, list):
                    total += sum(self.size(v, below) for v in value)
                elif value is not None:
                    total += self.size(value, below)
                if total > self.cap:
                    break
            if inlined and isinstance(s.get("$ref"), str) and total <= self.cap:
                self.resolver.bases = self.bases
                total += self.size(self.resolver.resolve(s["$ref"], "")[0], True)
        finally:
            if own_base:
                self.bases.pop()
            self.open.discard(key)
        self.memo[key] = total = min(total, self.cap + 1)
        return total


def check_schema(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """SchemaError when `schema` goes past `limits` or has a shape we refuse."""
    _Walk(schema, limits).visit(schema, "", 0)
    if _Merged(schema, limits.max_merged_nodes).size(schema) > limits.max_merged_nodes:
        raise SchemaError(f"the schema stands for more than {limits.max_merged_nodes} subschemas once each `$ref` "
                          f"under `allOf` is merged in (limit {limits.max_merged_nodes}); refer to shared "
                          f"definitions outside `allOf`")
