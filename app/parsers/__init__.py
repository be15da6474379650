"""Reply parsers: reasoning split and tool-call parsing, streaming and not.

No model, no I/O; see ``pipeline.ReplyParser`` for what the server calls.
"""
from __future__ import annotations

from .deltas import CallDelta, Delta, ToolCall, ToolDelta, new_call_id
from .pipeline import ReplyParser
from .reasoning import (
    REASONING_PARSERS, NoReasoningParser, ReasoningParser, ThinkReasoningParser,
    detect_reasoning_parser, get_reasoning_parser, template_starts_in_reasoning,
)
from .tools import (
    TOOL_PARSERS, HermesToolParser, Llama3JsonToolParser, MistralToolParser,
    PythonicToolParser, ToolParser, detect_tool_parser, get_tool_parser,
)

__all__ = [
    "CallDelta", "Delta", "ToolCall", "ToolDelta", "new_call_id",
    "ReplyParser",
    "REASONING_PARSERS", "ReasoningParser", "ThinkReasoningParser", "NoReasoningParser",
    "detect_reasoning_parser", "get_reasoning_parser", "template_starts_in_reasoning",
    "TOOL_PARSERS", "ToolParser", "HermesToolParser", "Llama3JsonToolParser",
    "MistralToolParser", "PythonicToolParser", "detect_tool_parser", "get_tool_parser",
]
