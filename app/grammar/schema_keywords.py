"""Reading a schema's keywords: which ones decide validity, which are refused, and their values
checked (types, counts within the limits, enum and const values measured before use)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from ..api import strict_json
from .json_values import map_leaves
from .schema_budget import RuleBudget, SchemaError, where

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

MISSING: Any = object()


def join_path(path: str, *segments: str | int) -> str:
    for seg in segments:
        if isinstance(seg, int):
            path += f"[{seg}]"
        else:
            text = seg if re.fullmatch(r"[A-Za-z0-9_$-]{1,40}", seg) else \
                strict_json.dumps(seg[:40], ensure_ascii=True)
            path = f"{path}.{text}" if path else text
    return path


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
    return strict_json.dumps(whole, compact=False, ensure_ascii=True, sort_keys=True)


def is_any(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not any(k in schema for k in VALIDATION))


def keywords(s: dict[str, Any], *leave_out: str) -> dict[str, Any]:
    """The validation keywords of `s`. Looks at those names only, so a schema with a huge
    number of other keys costs no more."""
    return {k: s[k] for k in VALIDATION if k in s and k not in leave_out}


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


class KeywordReader(RuleBudget):
    """Keyword values read and checked, each refusal a SchemaError naming the keyword and where it is."""

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
