"""The `response` object: a reply's reasoning, text and calls as output items, its usage under the
Responses API's names, and the request's parameters echoed as the spec requires."""

from __future__ import annotations

import time
import uuid
from typing import Any

from .schemas import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """The model's reasoning as it was generated: `content` (reasoning_text); no summary is written."""
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": [output_text(text)]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: dict[str, Any], cut: bool) -> list[dict[str, Any]]:
    """A parsed chat reply (`content`, `reasoning_content`, `tool_calls`) as output items, in the order a
    stream opens them; `cut`: the reply ended at its token limit, so its last item is incomplete."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(new_id("msg"), message.get("content") or ""))
    for call in calls:
        items.append(function_call_item(new_id("fc"), call["id"], call["function"]["name"],
                                        call["function"]["arguments"]))
    if cut and items:
        items[-1]["status"] = "incomplete"
    return items


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage as the Responses API names it; `reasoning_tokens` as the engine counted them."""
    inp, out = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    # cache_write_tokens: the SDK's model requires it; no write is billed apart here.
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": inp + out}


# Before the end: the spec's `usage` is an object, never null.
NO_USAGE = {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}


class ResponseShaper:
    """One response's object at each of its states (in progress, completed, incomplete, failed): one id and
    creation time, the request's parameters echoed."""

    def __init__(self, req: ResponsesRequest, response_id: str | None = None) -> None:
        self.req = req
        self.id = response_id or new_id("resp")
        self.created_at = int(time.time())

    def echo(self) -> dict[str, Any]:
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format \
            else {"type": "text"}
        choice = req.tool_choice or "auto"
        reasoning = req.reasoning.model_dump(exclude={"generate_summary"}) if req.reasoning else None
        optional = {"user": req.user} if req.user is not None else {}  # a string when present
        return {
            **optional, "model": req.model, "instructions": req.instructions,
            "tools": [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
                       "strict": t.strict} for t in req.tools or []],
            "tool_choice": choice if isinstance(choice, str) else {"type": "function", "name": choice.name},
            "text": {"format": fmt}, "temperature": req.temperature, "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": req.max_tool_calls,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "metadata": req.metadata or {},
            "previous_response_id": req.previous_response_id, "store": req.store is not False,
            "reasoning": reasoning, "truncation": req.truncation or "disabled",
            "background": False, "conversation": None,
        }

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        text = "".join(p["text"] for item in output if item["type"] == "message"
                       for p in item["content"] if p["type"] == "output_text")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            **self.echo(), "output": output, "output_text": text, "usage": usage or NO_USAGE,
        }

    def finished(self, output: list[dict[str, Any]], chat_usage: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        """The whole response: `incomplete` when the reply was cut at its token limit."""
        status = "incomplete" if finish_reason == "length" else "completed"
        return self.response(status, output, usage(chat_usage))

    def finished_reply(self, message: dict[str, Any], finish_reason: str | None,
                       chat_usage: dict[str, Any]) -> dict[str, Any]:
        """A whole reply (its parsed message, why it ended, its usage) as the response object."""
        return self.finished(output_items(message, finish_reason == "length"), chat_usage, finish_reason)
