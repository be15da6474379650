"""OpenAI response bodies and stream chunks, built in one place."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from ..engine.events import TokenLogprob

# JSON has no -inf; OpenAI reports tokens the model rules out as -9999.0.
FLOOR = -9999.0


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def _token(piece: bytes, logprob: float) -> dict[str, Any]:
    # A piece may hold part of a UTF-8 character: `token` shows it replaced, `bytes` keeps it exact.
    return {"token": piece.decode("utf-8", "replace"), "logprob": _value(logprob), "bytes": list(piece)}


def logprobs_content(entries: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
    """Engine logprobs in OpenAI's `choices[].logprobs.content` shape."""
    return [{**_token(e.token, e.logprob if e.logprob is not None else 0.0),
             "top_logprobs": [_token(piece, v) for piece, v in e.top]} for e in entries]


def chat_logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    return None if entries is None else {"content": logprobs_content(entries), "refusal": None}


def chat_choice(index: int, message: dict[str, Any], finish_reason: str | None,
                logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    """One choice of a `chat.completion`, from a parsed reply (`content`, `reasoning_content`, `tool_calls`)."""
    extras = {k: v for k, v in message.items() if k != "content" and v is not None}
    return {"index": index, "message": {"role": "assistant", "content": message.get("content"), "refusal": None,
                                        **extras},
            "logprobs": chat_logprobs(logprobs), "finish_reason": finish_reason}


def completion_body(request_id: str, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage}


class ChunkMaker:
    """`chat.completion.chunk`s of one stream: same id, creation time and model on every chunk."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.base = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}
        self.include_usage = include_usage

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None, index: int = 0,
              logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
        chunk = {**self.base, "choices": [{"index": index, "delta": delta, "logprobs": chat_logprobs(logprobs),
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    def role(self, index: int = 0) -> dict[str, Any]:
        return self.delta({"role": "assistant", "content": ""}, index=index)

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}
