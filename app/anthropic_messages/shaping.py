"""A reply in Anthropic's shapes: the whole `message` from the core's reading of it, and the pieces
the stream's events share with it (ids, stop reasons, usage, blocks)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api import strict_json


@dataclass(frozen=True)
class Totals:
    """What the engine counted for a reply: its prompt (and how much of it came from the cache), what it
    generated, and the stop sequence that ended it, if one did."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    stop_sequence: str | None = None


def message_id(request_id: str) -> str:
    return f"msg_{request_id}"


def tool_use_id(call_id: str) -> str:
    """The chat parser's `call_<24>` id as Anthropic spells one (`toolu_<24>`), the same in a body and a stream."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str | None:
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "stop":
        return "stop_sequence" if stop_sequence is not None else "end_turn"
    return None


def usage(totals: Totals, output_tokens: int | None = None) -> dict[str, Any]:
    """Anthropic's `usage`: `input_tokens` are the prompt tokens not read from the cache, so that
    input_tokens + cache_read_input_tokens is the whole prompt (a cache write costs nothing more here)."""
    return {"input_tokens": totals.prompt_tokens - totals.cached_tokens,
            "output_tokens": totals.completion_tokens if output_tokens is None else output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": totals.cached_tokens,
            "cache_creation": None, "inference_geo": None, "output_tokens_details": None, "server_tool_use": None,
            "service_tier": "standard"}


def delta_usage(totals: Totals) -> dict[str, Any]:
    """The usage a stream's message_delta carries: the totals so far (output_tokens is cumulative)."""
    full = usage(totals)
    return {key: full[key] for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                                       "cache_read_input_tokens", "output_tokens_details", "server_tool_use")}


def text_block(text: str = "") -> dict[str, Any]:
    return {"type": "text", "text": text, "citations": None}


def thinking_block(thinking: str = "") -> dict[str, Any]:
    # No signature: nothing here encrypts or checks thinking. The empty string keeps the field's type.
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_use_block(call_id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": input,
            "caller": {"type": "direct"}}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its `input` object; arguments a length cut left unparsable are `{}`."""
    try:
        value = strict_json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message(message_id_: str, model: str, content: list[dict[str, Any]], stop_reason_: str | None,
            stop_sequence: str | None, usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": message_id_, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason_, "stop_sequence": stop_sequence, "stop_details": None, "container": None,
            "usage": usage_}


def message_body(message_id_: str, model: str, reply: dict[str, Any], finish_reason: str | None,
                 totals: Totals) -> dict[str, Any]:
    """A whole reply (its parsed message: `content`, `reasoning_content`, `tool_calls`) as Anthropic's `message`:
    blocks thinking, text, tool_use, in the order a stream gives them."""
    content: list[dict[str, Any]] = []
    if reply.get("reasoning_content"):
        content.append(thinking_block(reply["reasoning_content"]))
    if reply.get("content"):
        content.append(text_block(reply["content"]))
    for call in reply.get("tool_calls") or []:
        fn = call["function"]
        content.append(tool_use_block(call["id"], fn["name"], tool_input(fn["arguments"])))
    stop = stop_reason(finish_reason, totals.stop_sequence)
    return message(message_id_, model, content, stop, totals.stop_sequence if stop == "stop_sequence" else None,
                   usage(totals))


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens}
