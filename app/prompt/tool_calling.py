"""How a request's tools reach the model and come back: template or fallback prompt, the
parser that reads the reply, and the grammar that forces a call when `tool_choice` demands one.

Templates that render `tools` themselves get them as-is. For templates that do not (small
models such as SmolLM2), tools are described in a system message and calls use the Hermes
`<tool_call>` format, so any model can be steered into valid calls by the grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .chat_template import content_text
from ..api import strict_json
from ..api.errors import invalid_request
from ..grammar.llguidance_grammars import GrammarError
from ..grammar.request_grammars import (GrammarLimits, SchemaError, check_tool_schema, forced_call_grammar,
                                      tool_call_schema)
from ..parsers import (
    REASONING_PARSERS, TOOL_PARSERS, detect_reasoning_parser, detect_tool_parser, template_starts_in_reasoning,
)
from ..api.schemas import ChatCompletionRequest

FALLBACK_TOOL_PARSER = "hermes"


@dataclass(frozen=True)
class ReplyFormat:
    """Per model, resolved once: which parsers read its replies."""

    reasoning: str
    starts_in_reasoning: bool
    tool_parser: str
    native_tools: bool


def resolve_reply_format(template: str, reasoning: str = "auto", tools: str = "auto") -> ReplyFormat:
    if reasoning == "auto":
        reasoning = detect_reasoning_parser(template)
    if reasoning not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning_parser {reasoning!r} (known: auto, {', '.join(REASONING_PARSERS)})")
    native = "tools" in template
    if tools == "auto":
        tools = (detect_tool_parser(template) if native else None) or FALLBACK_TOOL_PARSER
    if tools not in TOOL_PARSERS:
        raise ValueError(f"unknown tool_parser {tools!r} (known: auto, {', '.join(TOOL_PARSERS)})")
    starts = reasoning == "think" and template_starts_in_reasoning(template)
    return ReplyFormat(reasoning=reasoning, starts_in_reasoning=starts, tool_parser=tools, native_tools=native)


@dataclass
class ToolPlan:
    """What one request does with tools."""

    template_tools: list[dict[str, Any]] | None   # passed to the chat template
    messages: list[dict[str, Any]]                # possibly rewritten for the fallback format
    parser: str | None                            # tool parser for the reply (None: no tool parsing)
    grammar: str | None                           # forces a call (required / named): llguidance's


def validate_tools(req: ChatCompletionRequest, limits: GrammarLimits) -> dict[str, dict[str, Any]]:
    """Check tools and tool_choice; return name -> parameters schema."""
    tools: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(req.tools or []):
        fn = tool.function
        params = fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}
        where = f"tools[{i}].function.parameters"
        if params.get("type", "object") != "object":
            got = strict_json.dumps(params.get("type"), ensure_ascii=True)
            raise invalid_request(f"Invalid schema for function `{fn.name}`: its parameters must be a JSON Schema "
                                  f"of type `object`, got type {got}.", param=where,
                                  code="invalid_function_parameters")
        if fn.name in tools:
            raise invalid_request(f"Duplicate function name `{fn.name}`.", param=f"tools[{i}].function.name")
        try:
            check_tool_schema(params, limits)
        except (SchemaError, GrammarError) as exc:
            raise invalid_request(f"The parameters schema of `{fn.name}` is not supported: {exc}", param=where,
                                  code="invalid_function_parameters") from None
        tools[fn.name] = params
    choice = req.tool_choice
    if choice is not None and not tools and choice != "none":
        raise invalid_request("`tool_choice` is only allowed when `tools` are specified.", param="tool_choice")
    if choice is not None and not isinstance(choice, str):
        name = choice.function.get("name")
        if name not in tools:
            raise invalid_request(f"`tool_choice` names function `{name}`, which is not in `tools`.",
                                  param="tool_choice")
    return tools


def plan_tools(fmt: ReplyFormat, req: ChatCompletionRequest, messages: list[dict[str, Any]],
               limits: GrammarLimits = GrammarLimits()) -> ToolPlan:
    tools = validate_tools(req, limits)
    choice = req.tool_choice or "auto"
    if not tools or choice == "none":
        return ToolPlan(None, _fallback_messages(messages) if not fmt.native_tools else messages, None, None)

    forced: list[str] | None = None
    if choice == "required":
        forced = list(tools)
    elif not isinstance(choice, str):
        forced = [choice.function["name"]]

    parser = fmt.tool_parser
    # Pythonic calls cannot be grammar-forced with JSON schemas: forced calls use Hermes syntax.
    if forced and parser == "pythonic":
        parser = FALLBACK_TOOL_PARSER
    grammar = None
    if forced:
        args_key = "parameters" if parser == "llama3_json" else "arguments"
        try:
            grammar = forced_call_grammar(parser, [tool_call_schema(n, tools[n], args_key) for n in forced])
        except GrammarError as exc:  # each tool fits alone; all of them together may not
            raise invalid_request(f"The tools' parameter schemas together are too large to force a call: {exc}",
                                  param="tools", code="invalid_function_parameters") from None

    defs = [t.model_dump(exclude_none=True) for t in req.tools or []]
    if fmt.native_tools and parser == fmt.tool_parser:
        return ToolPlan(defs, messages, parser, grammar)
    return ToolPlan(None, _fallback_messages(messages, defs), parser, grammar)


def _fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Tools described in the system message; past calls and results as Hermes-style text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>\n" + strict_json.dumps({"name": c["function"]["name"],
                                                      "arguments": _json_or_text(c["function"]["arguments"])},
                                                     compact=False) + "\n</tool_call>"
                for c in m["tool_calls"])
            text = content_text(m.get("content"))
            out.append({"role": "assistant", "content": (text + "\n" if text else "") + calls})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content_text(m.get('content'))}\n</tool_response>"})
        else:
            out.append(m)
    if tools:
        listing = "\n".join(strict_json.dumps(t, compact=False) for t in tools)
        system = (
            "You can call functions. To call one, reply with a JSON object inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function name>, "arguments": <arguments object>}\n</tool_call>\n'
            f"Available functions:\n<tools>\n{listing}\n</tools>"
        )
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": content_text(out[0].get("content")) + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _json_or_text(s: str) -> Any:
    try:
        return strict_json.loads(s)
    except (json.JSONDecodeError, TypeError):
        return s
