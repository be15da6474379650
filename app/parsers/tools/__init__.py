"""Tool-call parsers, registered by name in ``TOOL_PARSERS``."""
from __future__ import annotations

from .base import ToolParser, calls_from_json
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .pythonic import PythonicToolParser, parse_pythonic

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser)
}


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {sorted(TOOL_PARSERS)}") from None


def detect_tool_parser(chat_template: str | None) -> str | None:
    """Tool parser name for a chat template, from the markers it mentions:
    ``<tool_call>`` -> hermes, ``[TOOL_CALLS]`` -> mistral, ``<|python_tag|>``
    or the Llama 3 ``ipython`` role -> llama3_json; else None."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3_json"
    return None


__all__ = [
    "TOOL_PARSERS", "ToolParser", "HermesToolParser", "Llama3JsonToolParser",
    "MistralToolParser", "PythonicToolParser", "calls_from_json",
    "detect_tool_parser", "get_tool_parser", "parse_pythonic",
]
