"""Ollama's reply records: a chat turn's `message` or a generation's `response`, streamed as records with
`done: false`, then the final record (`done: true`) with why it ended and its counts and durations.

The durations are in nanoseconds, as Ollama's, measured where the reply is read (the processing):
- `total_duration`: from the request reaching the processing (before its prompt is rendered) to its final record;
- `load_duration`: 0: a model is loaded before it serves (a pooled model's cold load, when a request waits for
  one, falls in `prompt_eval_duration`);
- `prompt_eval_duration`: from the request leaving for its model to the first generated text, less the time the
  engine says it waited for a slot;
- `eval_duration`: from the first generated text to the last.
`prompt_eval_count` is the whole prompt (cached prefix included: what clients count as input tokens), `eval_count`
the generated tokens."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from ..api import strict_json
from ..generation.tally import ReplyTally


def now_iso() -> str:
    """An RFC 3339 UTC time, as Ollama writes `created_at`."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def done_reason(finish_reason: str | None) -> str:
    """Ollama's `done_reason`: `length` for a reply cut at its limit, else `stop` (a reply that calls tools too)."""
    return "length" if finish_reason == "length" else "stop"


def final_fields(tally: ReplyTally, received_at: float, queued_s: float, finish_reason: str | None) -> dict[str, Any]:
    """The final record's fields: `done`, `done_reason` and the counts and durations (module docstring)."""
    now = time.monotonic()
    first = tally.first_text_at if tally.first_text_at is not None else now
    last = tally.last_text_at if tally.last_text_at is not None else first
    return {"done": True, "done_reason": done_reason(finish_reason),
            "total_duration": _ns(now - received_at), "load_duration": 0,
            "prompt_eval_count": tally.prompt_tokens, "prompt_eval_duration": _ns(first - tally.t0 - queued_s),
            "eval_count": tally.completion_tokens, "eval_duration": _ns(last - first)}


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments (the JSON text the model wrote) as the object Ollama's `tool_calls` carry; `{}` when a
    length cut left them unparsable."""
    try:
        value = strict_json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def ollama_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat's `tool_calls` (arguments as text) as Ollama's (arguments as an object, the call's place in `index`)."""
    return [{"id": call.get("id"), "function": {"index": i, "name": call["function"]["name"],
                                                "arguments": arguments_object(call["function"].get("arguments", ""))}}
            for i, call in enumerate(calls)]


def message(content: str = "", thinking: str | None = None,
            tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        out["thinking"] = thinking
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def chat_record(model: str, msg: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": model, "created_at": now_iso(), "message": msg, **({"done": False} | fields)}


def generate_record(model: str, response: str, thinking: str | None = None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": now_iso(), "response": response}
    if thinking:
        out["thinking"] = thinking
    return out | {"done": False} | fields


def load_record(model: str, chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a request that only loads (or unloads) its model: `done_reason` `load` or `unload`."""
    fields = {"done": True, "done_reason": reason}
    return chat_record(model, message(), **fields) if chat else generate_record(model, "", **fields)
