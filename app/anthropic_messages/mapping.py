"""A Messages request as the chat completions request it means, and the template switches it sets: from
here on it is planned, generated and parsed as chat is (templates, content marks, grammars, parsers, limits).

Anthropic's turns hold blocks; chat's hold fields. A user turn's `tool_result` blocks become `tool`
messages (the results of the calls of the turn before), its text a user message after them; an assistant
turn's `thinking` becomes its `reasoning_content`, its `tool_use` blocks its `tool_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api import strict_json
from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest, validation_error as chat_validation_error
from .schemas import (
    CountTokensRequest, ImageBlock, InputMessage, MessagesRequest, RedactedThinkingBlock, TextBlock, ThinkingAdaptive,
    ThinkingBlock, ThinkingDisabled, ThinkingEnabled, ToolChoiceAny, ToolChoiceAuto, ToolChoiceNone, ToolChoiceTool,
    ToolResultBlock, ToolUseBlock, _Conversation,
)

ERROR_PREFIX = "Error: "
"""Put before a `tool_result` with `is_error`: chat's tool messages have no flag, the model reads the text."""


@dataclass(frozen=True)
class MappedRequest:
    chat: ChatCompletionRequest


def to_chat_request(req: MessagesRequest | CountTokensRequest) -> MappedRequest:
    """The chat request a Messages request (or a token count) means: its `thinking` as chat's reasoning fields."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description is not None else {}),
            "parameters": t.input_schema.model_dump(), **({"strict": t.strict} if t.strict is not None else {})}}
            for t in req.tools]
    body.update(_tool_choice(req))
    if req.output_config is not None and req.output_config.format is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": req.output_config.format.schema_}}
    body.update(_thinking(req))
    if isinstance(req, MessagesRequest):
        body.update(_generation(req))
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # what Anthropic's shape allows and chat's does not (rare: limits)
        raise invalid_request(chat_validation_error(exc).message) from None
    return MappedRequest(chat)


def _generation(req: MessagesRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"max_tokens": req.max_tokens, "stream": bool(req.stream)}
    if req.stop_sequences:
        out["stop"] = req.stop_sequences
    out.update(req.speculative_chat_fields())
    for name in ("temperature", "top_p", "top_k", "cache_prompt"):
        if getattr(req, name) is not None:
            out[name] = getattr(req, name)
    if req.metadata is not None and req.metadata.user_id is not None:
        out["user"] = req.metadata.user_id
    return out


def _thinking(req: _Conversation) -> dict[str, Any]:
    """`thinking` as chat's reasoning fields (app/generation/reasoning.py): the `enable_thinking` switch (for
    templates that read it), and `enabled`'s `budget_tokens` as the reasoning budget the engine holds the reply
    to; `disabled` is no reasoning, `adaptive` the model's own budget. The budget is not checked against
    `max_tokens` (a model whose context is smaller than Anthropic's least budget could not think at all):
    `max_tokens` bounds the whole reply, thinking included."""
    if isinstance(req.thinking, ThinkingEnabled):
        return {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget_tokens": req.thinking.budget_tokens}
    if isinstance(req.thinking, ThinkingAdaptive):
        return {"chat_template_kwargs": {"enable_thinking": True}}
    if isinstance(req.thinking, ThinkingDisabled):
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}


def _tool_choice(req: _Conversation) -> dict[str, Any]:
    choice = req.tool_choice
    if choice is None:
        return {}
    if isinstance(choice, ToolChoiceNone):
        return {"tool_choice": "none"}
    out: dict[str, Any] = {}
    if isinstance(choice, ToolChoiceAuto):
        out["tool_choice"] = "auto"
    elif isinstance(choice, ToolChoiceAny):
        out["tool_choice"] = "required"
    elif isinstance(choice, ToolChoiceTool):
        if choice.name not in {t.name for t in req.tools or []}:
            raise invalid_request(f"tool_choice.name: tool `{choice.name}` is not in `tools`.",
                                  param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def chat_messages(req: _Conversation) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else "\n".join(b.text for b in req.system)
        out.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages):
        out.extend(_user_turn(message, i) if message.role == "user" else [_assistant_turn(message, i)])
    if req.messages[-1].role == "assistant":
        raise invalid_request(f"messages.{len(req.messages) - 1}: a final assistant message (a prefill for the "
                              f"model to continue) is not supported; end with a user message.",
                              param=f"messages.{len(req.messages) - 1}", code="unsupported_parameter")
    return out


def _user_turn(message: InputMessage, i: int) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []  # text and images since the last tool result, in order
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": block.url()}})
        elif isinstance(block, ToolResultBlock):
            if parts:  # what came before a result: its own user message, in order
                out.append({"role": "user", "content": _user_content(parts)})
                parts = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)})
        else:
            raise _wrong_role(block.type, "user", f"messages.{i}.content.{j}")
    if parts or not out:
        out.append({"role": "user", "content": _user_content(parts)})
    return out


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text blocks joined by newlines, as one string; with images, chat parts (newlines between texts kept)."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    out: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text" and out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + "\n" + part["text"]}
        else:
            out.append(part)
    return out


def _result_text(block: ToolResultBlock) -> str:
    content = block.content
    text = content if isinstance(content, str) else "\n".join(b.text for b in content or [])
    return ERROR_PREFIX + text if block.is_error else text


def _assistant_turn(message: InputMessage, i: int) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts, thinking, calls = [], [], []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": strict_json.dumps(block.input, compact=False)}})
        elif not isinstance(block, RedactedThinkingBlock):
            raise _wrong_role(block.type, "assistant", f"messages.{i}.content.{j}")
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thinking:
        out["reasoning_content"] = "\n".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _wrong_role(kind: str, role: str, where: str) -> Exception:
    other = "assistant" if role == "user" else "user"
    return invalid_request(f"{where}.type: `{kind}` blocks belong in {other} messages, not {role} messages.",
                           param=f"{where}.type")
