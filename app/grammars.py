"""GBNF grammars from JSON schemas (llama.cpp's own converter), for forced tool calls and
`response_format`. A schema the converter cannot handle is the client's 400, found here,
before any model sees it."""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from .errors import invalid_request


class SchemaError(ValueError):
    pass


def _converter() -> SchemaConverter:
    # name before arguments, so models write the function name first
    return SchemaConverter(prop_order={"name": 0, "arguments": 1, "parameters": 1}, allow_fetch=False,
                           dotall=False, raw_pattern=False)


def schema_rules(schema: dict[str, Any], rule: str) -> str:
    """GBNF rules defining `rule` as JSON matching `schema` (no root rule)."""
    conv = _converter()
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "request")
        conv.visit(resolved, rule)
        return conv.format_grammar()
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SchemaError(str(exc) or type(exc).__name__) from None


def json_grammar(schema: dict[str, Any], param: str) -> str:
    try:
        rules = schema_rules(schema, "json-value")
    except SchemaError as exc:
        raise invalid_request(f"The JSON schema cannot be turned into a grammar: {exc}", param=param,
                              code="invalid_schema") from None
    return rules + "\nroot ::= json-value\n"


def tool_call_schema(name: str, parameters: dict[str, Any] | None, args_key: str = "arguments") -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, args_key: parameters or {"type": "object"}},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def literal(text: str) -> str:
    """A GBNF string literal."""
    return json.dumps(text)
