"""`text_completion` bodies and stream chunks, and OpenAI's legacy logprobs shape
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..engine.events import TokenLogprob


def token_text(token: bytes) -> str:
    """A token's text; a piece of a UTF-8 character becomes U+FFFD."""
    return token.decode("utf-8", errors="replace")


def top_dict(entry: TokenLogprob) -> dict[str, float] | None:
    """The position's most likely tokens, most likely first, and the chosen token (OpenAI: up to
    `logprobs` + 1 entries). None where nothing was predicted (the prompt's first token)."""
    if entry.logprob is None:
        return None
    out: dict[str, float] = {}
    for token, logprob in sorted((*entry.top, (entry.token, entry.logprob)), key=lambda t: -t[1]):
        out.setdefault(token_text(token), logprob)  # two tokens may share a text: keep the likelier
    return out


@dataclass
class LegacyLogprobs:
    """One choice's logprobs, in the legacy shape; `text_offset` counts characters of the choice's
    own text (the echoed prompt included), from where the previous part ended when streamed."""

    offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, entries: Iterable[TokenLogprob]) -> None:
        for entry in entries:
            text = token_text(entry.token)
            self.tokens.append(text)
            self.token_logprobs.append(entry.logprob)
            self.top_logprobs.append(top_dict(entry))
            self.text_offset.append(self.offset)
            self.offset += len(text)

    def take(self) -> dict[str, Any]:
        """The entries so far as the legacy object, and a fresh start for the next part (same offset)."""
        body = {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return body


def choice(index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


class CompletionMaker:
    """The bodies of one legacy request: same id, creation time and model in every one."""

    def __init__(self, request_id: str, model: str) -> None:
        self.base = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
                     "model": model}

    def body(self, choices: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        return {**self.base, "choices": choices, "usage": usage}

    def chunk(self, index: int, text: str, logprobs: dict[str, Any] | None = None,
              finish_reason: str | None = None) -> dict[str, Any]:
        # OpenAI's stream has `finish_reason: null` until a choice's last chunk (its spec leaves the null out).
        return {**self.base, "choices": [choice(index, text, logprobs, finish_reason)]}

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}
