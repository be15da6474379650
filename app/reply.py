"""The reply parser for one request: the model's reasoning format, the tool format the request
uses, and the request's own switches (include_reasoning, parallel_tool_calls)."""

from __future__ import annotations

from .parsers import ReplyParser
from .schemas import ChatCompletionRequest
from .tool_calling import ReplyFormat


def make_reply_parser(fmt: ReplyFormat, req: ChatCompletionRequest, tool_parser: str | None) -> ReplyParser:
    return ReplyParser(
        reasoning=fmt.reasoning,
        tools=tool_parser,
        include_reasoning=req.include_reasoning is not False,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        starts_in_reasoning=fmt.starts_in_reasoning,
        tool_names=frozenset(t.function.name for t in req.tools or []) or None,
    )
