"""The grammars a request asks for, as llguidance grammars: `response_format` schemas, a forced tool call
in its parser's syntax, a client's GBNF. What is refused is the client's 400 naming the field, found here,
before any model sees it."""

from __future__ import annotations

from typing import Any

from ..api.errors import invalid_request
from .llguidance_grammars import GrammarError, check, from_gbnf, from_json_schema, from_lark, lark_json, lark_literal
from .schema_limits import DEFAULT_LIMITS, GrammarLimits, SchemaError, check_schema

__all__ = ["GrammarLimits", "SchemaError", "check_tool_schema", "client_grammar", "forced_call_grammar",
           "json_grammar", "tool_call_schema"]

# What wraps a forced call in each tool parser's syntax.
CALL_WRAPPERS = {
    "llama3_json": ("", ""),
    "mistral": ("[TOOL_CALLS][", "]"),
}
HERMES_WRAPPER = ("<tool_call>\n", "\n</tool_call>")


def json_grammar(schema: Any, param: str, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """The grammar of JSON valid against `schema` (the request's `param`)."""
    try:
        check_schema(schema, limits)
        grammar = from_json_schema(schema)
        check(grammar)
    except (SchemaError, GrammarError) as exc:
        raise invalid_request(f"The JSON schema cannot be turned into a grammar: {exc}", param=param,
                              code="invalid_schema") from None
    return grammar


def check_tool_schema(schema: Any, limits: GrammarLimits) -> None:
    """SchemaError (or GrammarError) when a tool's parameters could not be forced."""
    check_schema(schema, limits)
    check(from_json_schema(schema))


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


def forced_call_grammar(parser: str, calls: list[dict[str, Any]]) -> str:
    """One call, any of `calls` (tool_call_schema's), in `parser`'s syntax."""
    opening, closing = CALL_WRAPPERS.get(parser, HERMES_WRAPPER)
    lines = [f"start: {lark_literal(opening) if opening else ''} call {lark_literal(closing) if closing else ''}",
             "call: " + " | ".join(f"call{i}" for i in range(len(calls)))]
    lines += [f"call{i}: {lark_json(c)}" for i, c in enumerate(calls)]
    grammar = from_lark("\n".join(lines) + "\n")
    check(grammar)
    return grammar


def client_grammar(gbnf: str, param: str, max_depth: int, max_repetition: int) -> str:
    try:
        return from_gbnf(gbnf, max_depth, max_repetition)
    except GrammarError as exc:
        raise invalid_request(exc.message, param=param, code=exc.code) from None
