"""Choose the reply parser for a request (reasoning split, tool calls)."""

from __future__ import annotations

from typing import Any

from .config import ModelSpec
from .schemas import ChatCompletionRequest


class PassthroughParser:
    """All generated text is `content`."""

    made_tool_calls = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        return [{"content": piece}] if piece else []

    def finish(self) -> list[dict[str, Any]]:
        return []

    def parse(self, text: str) -> dict[str, Any]:
        return {"content": text}


def make_reply_parser(spec: ModelSpec, req: ChatCompletionRequest) -> PassthroughParser:
    return PassthroughParser()
