"""``ReplyParser``: reasoning split first, then tool calls in the content.

Produces OpenAI chat-completion delta dicts (streaming) and message fields
(non-streaming). Streaming and ``parse`` agree for any split of the text.
"""
from __future__ import annotations

from .deltas import CallDelta, Delta, ToolDelta
from .reasoning import get_reasoning_parser
from .tools import get_tool_parser


class ReplyParser:
    def __init__(self, reasoning: str = "none", tools: str | None = None, *,
                 include_reasoning: bool = True, parallel_tool_calls: bool = True,
                 starts_in_reasoning: bool = False,
                 think_tags: tuple[str, str] = ("<think>", "</think>"),
                 tool_names: frozenset[str] | None = None) -> None:
        self._reasoning = get_reasoning_parser(reasoning)(
            start_tag=think_tags[0], end_tag=think_tags[1],
            starts_in_reasoning=starts_in_reasoning)
        self._tools = get_tool_parser(tools)(tool_names) if tools else None
        self.include_reasoning = include_reasoning
        self.parallel_tool_calls = parallel_tool_calls
        self._made_calls = False

    @property
    def made_tool_calls(self) -> bool:
        """At least one tool call was emitted (finish_reason "tool_calls")."""
        return self._made_calls

    def feed(self, piece: str) -> list[dict]:
        return self._convert(self._reasoning.feed(piece), final=False)

    def finish(self) -> list[dict]:
        return self._convert(self._reasoning.finish(), final=True)

    def has_open_call(self, text: str) -> bool:
        """``text`` (a reply so far) ends inside a tool call whose JSON is not
        closed: continuing the generation could complete it. A reply cut
        inside reasoning has no open call."""
        if self._tools is None:
            return False
        content = "".join(d.text for d in self._reasoning.fresh().feed(text) if d.kind == "content")
        return self._tools.has_open_call(content)

    def parse(self, text: str) -> dict:
        """Whole reply -> ``{"content", "reasoning_content", "tool_calls"}``."""
        reasoning, content = self._reasoning.parse(text)
        calls = []
        if self._tools is not None:
            content, calls = self._tools.parse(content)
            if not self.parallel_tool_calls:
                calls = calls[:1]
        return {
            "content": (content or None) if calls else content,
            "reasoning_content": reasoning if self.include_reasoning else None,
            "tool_calls": [c.to_openai() for c in calls] or None,
        }

    # -- internals -------------------------------------------------------
    def _convert(self, deltas: list[Delta], final: bool) -> list[dict]:
        out: list[dict] = []
        for d in deltas:
            if d.kind == "reasoning":
                if self.include_reasoning:
                    out.append({"reasoning_content": d.text})
            elif self._tools is None:
                out.append({"content": d.text})
            else:
                out.extend(self._tool_dicts(self._tools.feed(d.text)))
        if final and self._tools is not None:
            out.extend(self._tool_dicts(self._tools.finish()))
        return _merge(out)

    def _tool_dicts(self, deltas: list[ToolDelta]) -> list[dict]:
        out = []
        for d in deltas:
            if isinstance(d, CallDelta):
                if d.index > 0 and not self.parallel_tool_calls:
                    continue
                self._made_calls = True
                out.append({"tool_calls": [d.to_openai()]})
            elif d.text:
                out.append({"content": d.text})
        return out


def _merge(dicts: list[dict]) -> list[dict]:
    """Adjacent text deltas of the same kind joined; tool-call deltas stay as the parser made them
    (a header, then argument fragments: OpenAI's streaming shape)."""
    out: list[dict] = []
    for d in dicts:
        (key, value), = d.items()
        if key != "tool_calls" and out and key in out[-1]:
            out[-1][key] += value
        else:
            out.append({key: value})
    return out
