"""Checks a model spec must pass before the app is built (builder and `llamaray check-config`): its chat
template compiles and its reply format (reasoning, tool calls) resolves."""

from __future__ import annotations

from ..config.schema import ConfigError
from ..config.spec import ModelSpec
from .chat_template import check_template
from .tool_calling import resolve_reply_format


def preflight(spec: ModelSpec) -> None:
    if spec.kind != "chat":
        return  # an embedding model or a reranker: no template, no reply to parse
    try:
        check_template(spec.chat_template)
        resolve_reply_format(spec.chat_template, spec.reasoning_parser, spec.tool_parser)
    except ValueError as exc:
        raise ConfigError(f"model {spec.id!r}: {exc}") from None
