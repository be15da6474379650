"""One reply's running totals: its text, token counts and timing, over all its generation rounds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..api.errors import EMPTY_REPLY, APIError
from ..engine.events import Finished, Started
from ..observe.request_records import RequestRecord


class ReplyTally:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.first_text_at: float | None = None
        self.last_text_at: float | None = None
        self.pieces: list[str] = []
        self.started = False
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.reasoning_tokens = 0  # of the completion's, as the engine counted them (Finished.reasoning_tokens)
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None  # which stop sequence ended the reply, when one did

    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def empty(self) -> bool:
        """Nothing but whitespace generated: no content, reasoning or tool call (all come from the text)."""
        return not any(p.strip() for p in self.pieces)

    def start(self, ev: Started) -> None:
        self.started = True
        self.prompt_tokens, self.cached_tokens = ev.prompt_tokens, ev.cached_tokens

    def add_prompt(self, ev: Started) -> None:
        """One more prompt of a request that has several (a legacy completion's list of prompts)."""
        self.started = True
        self.prompt_tokens += ev.prompt_tokens
        self.cached_tokens += ev.cached_tokens

    def add_text(self, text: str) -> None:
        now = time.monotonic()
        if self.first_text_at is None:
            self.first_text_at = now
        self.last_text_at = now
        self.pieces.append(text)

    def end_round(self, ev: Finished) -> None:
        self.completion_tokens += ev.completion_tokens
        self.reasoning_tokens += ev.reasoning_tokens

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def record(self, model: str, stream: bool, exc: BaseException | None, protocol: str) -> RequestRecord:
        status, code = "ok", None
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            status = "cancelled"
        elif exc is not None:
            code = exc.code if isinstance(exc, APIError) else "internal_error"
            status = {"timeout": "timeout", EMPTY_REPLY: "empty"}.get(code, "error")
        elif self.finish_reason is not None and self.empty:
            status = "empty"  # answered as it is (empty_reply: allow), yet worth counting
        ttft = self.first_text_at - self.t0 if self.first_text_at is not None else None
        itl = None
        if self.first_text_at is not None and self.completion_tokens > 1:
            itl = (self.last_text_at - self.first_text_at) / (self.completion_tokens - 1)
        return RequestRecord(model=model, stream=stream, status=status, error_code=code,
                             duration_s=time.monotonic() - self.t0, ttft_s=ttft, itl_s=itl,
                             prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                             cached_tokens=self.cached_tokens, protocol=protocol, finish_reason=self.finish_reason)
