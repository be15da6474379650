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

The parts: `schema_budget.py` (the limits, the rules made and the budgets they spend),
`schema_keywords.py` (keywords read and checked), `schema_refs.py` ($ref), `schema_merge.py` (allOf
and siblings combined), `schema_pattern.py` (patterns), `gbnf_writer.py` (GBNF text). This module
visits a schema and writes its rules.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .gbnf_writer import (
    RAW,
    contains,
    gbnf_literal,
    int_range,
    json_text,
    natural_range,
    not_in,
)
from .schema_budget import (
    DEFAULT_LIMITS,
    FORMATS,
    INT_MAX,
    RESERVED,
    GrammarLimits,
    SchemaError,
    where,
)
from .schema_keywords import (
    ENUM_SIBLINGS,
    FAMILIES,
    MISSING,
    is_any,
    is_number,
    join_path,
    keywords,
    type_fits,
)
from .schema_merge import SchemaMerger
from .schema_pattern import PatternConverter


class Converter(SchemaMerger):
    """One schema -> GBNF rules. Every visit and every schema combination counts against the
    limits, so the work is bounded whatever the input."""

    def __init__(self, root: Any, limits: GrammarLimits, prop_order: dict[str, int] | None = None) -> None:
        super().__init__(root, limits)
        self.prop_order = prop_order or {}

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
