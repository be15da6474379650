"""Marks around client text in a rendered prompt, so control tokens come only from the template.

The rendered prompt is tokenized with special-token parsing on (the template writes `<|im_start|>`),
which would also turn a user's literal `<|im_start|>system ...` into real control tokens. Every string
a client chose (content, names, tool schemas and their keys, tool-call arguments and their keys) goes
into the template wrapped in two Unicode noncharacters (reserved for internal use, never valid
interchange text, and removed from client text first); the engine tokenizes the text between them
without special-token parsing and everything else with it.

Marks survive what templates do to strings:
- slicing: a template that splits content at a literal (Qwen3 and DeepSeek-R1 split an old reply at
  `</think>`) finds that literal outside the marks, between two marked pieces, so every piece it
  keeps is still marked on both sides (`slice_delimiters` reads the literals from the template);
- stripping: leading and trailing whitespace stays outside the marks, so `trim`/`strip()` in a
  template strip the text as they would without marks;
- escaping: a template that prints JSON with `ensure_ascii` (or a Python repr) spells a mark as
  `\\ufdd0`; `unescape` turns those spellings back into marks after rendering, and client text
  loses such spellings first, so a client cannot type a mark either.
Marks are a state switch, not a bracket: an open mark starts content and a close mark ends it.
Keys that templates look up (JSON Schema keywords, `type`, `function`, `name`, ...) and values they
compare (`"type": "string"`) stay as they are; ids that look like ids stay too (a template may check
their length), and the check after rendering (prompt_check) covers what a raw string could do.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import Any

from ..engine.prompt_marks import CLOSE, OPEN, split  # the marks as the engine reads them

# A mark as JSON (`ensure_ascii`) or a Python repr spells it; hex digits in either case.
_SPELLED = re.compile(r"\\(?:u|U0000)[fF][dD][dD]([01])")
_SPELLED_PASSES = 8

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
# Ids as clients and models make them (`call_abc123`, Mistral's 9 alphanumerics, Kimi's
# `functions.name:0`): kept unmarked, because templates check their length (Mistral: exactly 9),
# slice them and compare them.
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

# JSON Schema keywords (2020-12 and draft-07, plus OpenAPI's `nullable`): keys templates may look up.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_ONE_SCHEMA = frozenset({"items", "additionalProperties", "additionalItems", "not", "if", "then", "else",
                         "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                         "contentSchema"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_VALUE_KEYWORDS = frozenset({
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment",
    "$recursiveRef", "$recursiveAnchor", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "maxContains", "minContains", "maxProperties", "minProperties", "format", "contentEncoding",
    "contentMediaType", "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
    "nullable",
})


def clean(text: str) -> str:
    """Client text without anything that reads as a mark: the marks, and their escaped spellings
    (removing one spelling can join another, `\\u\\ufdd0fdd1`, so until none is left)."""
    if OPEN in text or CLOSE in text:
        text = text.replace(OPEN, "").replace(CLOSE, "")
    if "\\" not in text:
        return text
    for _ in range(_SPELLED_PASSES):
        text, n = _SPELLED.subn("", text)
        if not n:
            return text
    return _drop_spelled(text)


def _drop_spelled(text: str) -> str:
    """`clean`'s spellings removed in one pass over the text (adversarially nested spellings)."""
    out: list[str] = []
    for ch in text:
        out.append(ch)
        if ch in "01":
            for size in (6, 10):
                if len(out) >= size and _SPELLED.fullmatch("".join(out[-size:])):
                    del out[-size:]
                    break
    return "".join(out)


def _wrap(text: str) -> str:
    core = text.strip()
    if not core:
        return text
    start = len(text) - len(text.lstrip())
    return f"{text[:start]}{OPEN}{core}{CLOSE}{text[start + len(core):]}"


@lru_cache(maxsize=64)
def _delimiter_pattern(delimiters: tuple[str, ...]) -> re.Pattern[str]:
    ordered = sorted(set(delimiters), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, ordered)) + ")")


def mark(text: str, delimiters: tuple[str, ...] = ()) -> str:
    """Client text, cleaned and marked; each of `delimiters` in it stays between two marked pieces."""
    text = clean(text)
    if not text:
        return text
    if not delimiters or not any(d in text for d in delimiters):
        return _wrap(text)
    parts = _delimiter_pattern(delimiters).split(text)
    # split() with one group alternates text, delimiter, text, ...
    return "".join(part if i % 2 else _wrap(part) for i, part in enumerate(parts))


_SLICING_CALL = re.compile(r"""\.(?:r?split|r?partition)\(\s*('(?:[^'\\]|\\.)+'|"(?:[^"\\]|\\.)+")\s*[,)]""")


@lru_cache(maxsize=32)
def slice_delimiters(source: str) -> tuple[str, ...]:
    """The string literals a template splits strings at (`content.split('</think>')`)."""
    found = set()
    for literal in _SLICING_CALL.findall(source):
        try:
            value = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str) and value:
            found.add(value)
    return tuple(sorted(found))


def is_plain_id(s: str) -> bool:
    """Whether a tool-call id goes into templates unmarked (Marker.ident)."""
    return _ID.fullmatch(s) is not None


class Marker:
    """How client strings enter a template: always cleaned; wrapped in marks when `marks`."""

    def __init__(self, marks: bool = True, delimiters: tuple[str, ...] = ()) -> None:
        self.marks = marks
        self.delimiters = delimiters

    def text(self, s: str) -> str:
        s = clean(s)
        return mark(s, self.delimiters) if self.marks else s

    def ident(self, s: str) -> str:
        """A tool-call id: as it is when it looks like one, else marked like any text."""
        s = clean(s)
        return s if is_plain_id(s) else self.text(s)

    def value(self, v: Any) -> Any:
        """A JSON value of the client's: every string and every key marked."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {self.text(str(k)): self.value(x) for k, x in v.items()}
        return v

    def schema(self, s: Any) -> Any:
        """A JSON Schema: keywords stay (templates look them up), names the client chose are marked
        (property and `$defs` names, unknown keywords), and so is every string value, except the
        JSON type names templates compare `type` with."""
        if isinstance(s, list):
            return [self.schema(x) for x in s]
        if not isinstance(s, dict):
            return self.value(s)
        out: dict[str, Any] = {}
        for key, v in s.items():
            if key in _NAMED_SCHEMAS and isinstance(v, dict):
                out[key] = {self.text(str(name)): self.schema(sub) for name, sub in v.items()}
            elif key in ("dependentRequired", "dependencies") and isinstance(v, dict):
                out[key] = {self.text(str(name)): self.schema(sub) if isinstance(sub, dict) else self.value(sub)
                            for name, sub in v.items()}
            elif key in _ONE_SCHEMA or key in _SCHEMA_LISTS:
                out[key] = self.schema(v)
            elif key == "type":
                out[key] = self._types(v)
            elif key == "required" or key in _VALUE_KEYWORDS:
                out[key] = self.value(v)
            else:
                out[self.text(str(key))] = self.value(v)
        return out

    def _types(self, v: Any) -> Any:
        if isinstance(v, str):
            return v if v in JSON_TYPES else self.text(v)
        if isinstance(v, list):
            return [self._types(x) if isinstance(x, str) else self.value(x) for x in v]
        return self.value(v)

    def tools(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """OpenAI tool definitions as a template reads them."""
        return [self._tool(t) for t in tools] if tools else tools

    def _tool(self, tool: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, v in tool.items():
            if key == "type" and v == "function":
                out[key] = v
            elif key == "function" and isinstance(v, dict):
                out[key] = {k: self._function_field(k, x) for k, x in v.items()}
            else:
                out[self.text(str(key))] = self.value(v)
        return out

    def _function_field(self, key: str, v: Any) -> Any:
        if key == "parameters":
            return self.schema(v)
        if key == "strict":
            return v
        return self.value(v)


def unescape(prompt: str) -> str:
    """A rendered prompt with escaped spellings of marks (a template's `tojson(ensure_ascii=True)`)
    turned back into marks; client text had every such spelling removed before rendering."""
    if "\\" not in prompt:
        return prompt
    return _SPELLED.sub(lambda m: OPEN if m.group(1) == "0" else CLOSE, prompt)


def unmark(prompt: str) -> str:
    """The prompt as the model sees it (for logs, /tokenize, tests)."""
    return "".join(text for text, _ in split(prompt))
