"""Local `$ref`s: JSON pointers resolved within the current resource, each target made into one rule
(recursion refers back to it), and a ref that reaches itself before any { or [ refused."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from .schema_budget import GrammarLimits, SchemaError, where
from .schema_keywords import KeywordReader, join_path


class RefResolver(KeywordReader):
    """Refs resolved against `base`: the resource `#` refers to (the root, or the nearest enclosing
    subschema with an `$id`)."""

    def __init__(self, root: Any, limits: GrammarLimits) -> None:
        super().__init__(limits)
        self.base: tuple[Any, str] = (root, "")  # the resource `#` refers to, and its path
        self.ref_rules: dict[tuple[int, str], str] = {}
        self.unguarded: set[tuple[int, str]] = set()  # refs entered since the last { or [

    def visit(self, s: Any, name: str, path: str, depth: int) -> str:
        raise NotImplementedError  # the converter's: a ref's target is visited like any schema

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
