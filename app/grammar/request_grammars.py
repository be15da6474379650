"""GBNF grammars from JSON schemas, for forced tool calls and `response_format`, made by our
own converter (`json_schema_grammar`), which bounds the work a hostile schema can cause. A
schema the converter refuses is the client's 400, found here, before any model sees it."""

from __future__ import annotations

from typing import Any

from ..api.errors import invalid_request
from .json_schema_grammar import DEFAULT_LIMITS, GrammarLimits, SchemaError, gbnf_literal, schema_to_rules

__all__ = ["GrammarLimits", "SchemaError", "json_grammar", "literal", "schema_rules", "tool_call_schema"]

# name before arguments, so models write the function name first
PROP_ORDER = {"name": 0, "arguments": 1, "parameters": 1}


def schema_rules(schema: dict[str, Any], rule: str, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF rules defining `rule` as JSON matching `schema` (no root rule). SchemaError when
    the schema is refused or goes over `limits`."""
    return schema_to_rules(schema, rule, limits, PROP_ORDER)


def json_grammar(schema: dict[str, Any], param: str, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    try:
        rules = schema_rules(schema, "json-value", limits)
    except SchemaError as exc:
        raise invalid_request(f"The JSON schema cannot be turned into a grammar: {exc}", param=param,
                              code="invalid_schema") from None
    return rules + "\nroot ::= json-value\n"


def tool_call_schema(name: str, parameters: dict[str, Any] | None, args_key: str = "arguments") -> dict[str, Any]:
    args = parameters or {"type": "object"}
    if "$id" not in args:
        # its own resource, so its local refs (#/$defs/...) resolve within it once wrapped
        args = {**args, "$id": f"urn:llamaray:tool:{name}"}
    return {
        "type": "object",
        "properties": {"name": {"const": name}, args_key: args},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def literal(text: str) -> str:
    """A GBNF string literal."""
    return gbnf_literal(text)
