"""OpenAI response bodies and stream chunks, built in one place."""

from __future__ import annotations

import time
from typing import Any


def completion_body(request_id: str, model: str, message: dict[str, Any], finish_reason: str | None,
                    usage: dict[str, Any]) -> dict[str, Any]:
    """A `chat.completion` from a parsed reply (`content`, `reasoning_content`, `tool_calls`)."""
    extras = {k: v for k, v in message.items() if k != "content" and v is not None}
    return {
        "id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": message.get("content"),
                                             "refusal": None, **extras},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    }


class ChunkMaker:
    """`chat.completion.chunk`s of one stream: same id, creation time and model on every chunk."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.base = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}
        self.include_usage = include_usage

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        chunk = {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    def role(self) -> dict[str, Any]:
        return self.delta({"role": "assistant", "content": ""})

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}
