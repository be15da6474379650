"""Schemas combined into their intersection (allOf, $ref or anyOf with siblings), keyword by keyword:
bounds tightened, enums intersected, properties merged, anyOf distributed; what cannot be combined is
refused."""

from __future__ import annotations

from typing import Any

from .schema_budget import FORMATS, SchemaError, where
from .schema_keywords import (
    LOWER,
    MISSING,
    TYPES,
    UPPER,
    VALIDATION,
    canonical,
    is_any,
    is_number,
    join_path,
    keywords,
    plain_bounds,
    type_fits_name,
)
from .schema_refs import RefResolver


class SchemaMerger(RefResolver):
    """Every combination counts against the node and depth limits."""

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


def same_ref(a: Any, b: Any) -> bool:
    return (isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("$ref"), str)
            and a.get("$ref") == b.get("$ref") and not keywords(a, "$ref") and not keywords(b, "$ref"))
