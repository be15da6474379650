"""Reasoning parsers: split a reply into reasoning and content.

Parsers are registered by name in ``REASONING_PARSERS``:

* ``think`` - text between ``start_tag`` and ``end_tag`` (``<think>`` /
  ``</think>`` by default) is reasoning, the rest is content.
* ``none``  - everything is content.

Rules of ``think`` (streaming and ``parse`` give the same result, because
``parse`` runs the streaming machine over the whole text):

* Tag text never reaches either field; a tag cut across pieces is held back
  (only the longest buffer suffix that is a proper tag prefix) and never
  emitted in fragments.
* Whitespace on both sides of a tag is dropped: ``<think>\\nR\\n</think>\\n\\nC``
  gives reasoning ``R`` and content ``C``. Elsewhere whitespace is kept.
* A start tag while inside reasoning, or an end tag while in content, is
  stray: it is dropped (with the whitespace around it) and the mode stays.
  This tolerates the ``<think>`` that ``starts_in_reasoning`` models may
  repeat at the very start.
* A reply still inside reasoning at the end (never closed) and that produced
  no content: ``finish()`` delivers the whole reasoning text again as
  content, so the client never gets an empty answer. ``parse`` then returns
  ``(text, text)``.
* ``parse`` returns ``None`` for the reasoning when there was none (or it
  was empty, as in ``<think>\\n\\n</think>``).
"""
from __future__ import annotations

import re
from typing import ClassVar

from .deltas import Delta
from .partial import EdgeTrim, StreamMachine, find_first, partial_prefix_len


def merge_deltas(deltas: list[Delta]) -> list[Delta]:
    """Merge adjacent deltas of the same kind; drop empty ones."""
    out: list[Delta] = []
    for d in deltas:
        if not d.text:
            continue
        if out and out[-1].kind == d.kind:
            out[-1] = Delta(d.kind, out[-1].text + d.text)
        else:
            out.append(d)
    return out


class ReasoningParser:
    """Base class. One instance parses one reply (streaming)."""

    name: ClassVar[str]

    def __init__(self, *, start_tag: str = "<think>", end_tag: str = "</think>",
                 starts_in_reasoning: bool = False) -> None:
        self.start_tag = start_tag
        self.end_tag = end_tag
        self.starts_in_reasoning = starts_in_reasoning

    def feed(self, piece: str) -> list[Delta]:
        raise NotImplementedError

    def finish(self) -> list[Delta]:
        raise NotImplementedError

    def fresh(self) -> "ReasoningParser":
        """A new parser with the same settings."""
        return type(self)(start_tag=self.start_tag, end_tag=self.end_tag,
                          starts_in_reasoning=self.starts_in_reasoning)

    def parse(self, text: str) -> tuple[str | None, str]:
        """Non-streaming: ``(reasoning or None, content)``."""
        p = self.fresh()
        reasoning, content = [], []
        for d in p.feed(text) + p.finish():
            (reasoning if d.kind == "reasoning" else content).append(d.text)
        return ("".join(reasoning) or None), "".join(content)


class NoReasoningParser(ReasoningParser):
    name = "none"

    def feed(self, piece: str) -> list[Delta]:
        return [Delta("content", piece)] if piece else []

    def finish(self) -> list[Delta]:
        return []


class ThinkReasoningParser(StreamMachine, ReasoningParser):
    name = "think"

    def __init__(self, **kwargs) -> None:
        ReasoningParser.__init__(self, **kwargs)
        StreamMachine.__init__(self)
        self._tags = (self.start_tag, self.end_tag)
        self._in_reasoning = self.starts_in_reasoning
        self._trim = {"content": EdgeTrim(), "reasoning": EdgeTrim(strip_leading=True)}
        self._reasoning_text: list[str] = []
        self._content_sent = False

    def finish(self) -> list[Delta]:
        return merge_deltas(StreamMachine.finish(self))

    def _tail(self) -> list[Delta]:
        kind = self._kind()
        out = self._out(kind, self._trim[kind].flush())
        if self._in_reasoning and not self._content_sent:
            out += self._out("content", "".join(self._reasoning_text))
        return out

    # -- internals -------------------------------------------------------
    def _kind(self) -> str:
        return "reasoning" if self._in_reasoning else "content"

    def _out(self, kind: str, text: str) -> list[Delta]:
        if not text:
            return []
        if kind == "reasoning":
            self._reasoning_text.append(text)
        else:
            self._content_sent = True
        return [Delta(kind, text)]

    def _emit(self, text: str) -> list[Delta]:
        kind = self._kind()
        return self._out(kind, self._trim[kind].push(text))

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        buf = self._buf
        while True:
            i, tag = find_first(buf, self._tags)
            if i < 0:
                keep = 0 if final else partial_prefix_len(buf, self._tags)
                out += self._emit(buf[:len(buf) - keep])
                buf = buf[len(buf) - keep:]
                break
            out += self._emit(buf[:i])
            buf = buf[i + len(tag):]
            self._on_tag(tag)
        self._buf = buf
        return merge_deltas(out)

    def _on_tag(self, tag: str) -> None:
        opening = tag == self.start_tag
        if opening == self._in_reasoning:  # stray tag: drop it, stay in mode
            self._keep_apart(self._kind())
            return
        # leaving the current mode: its held trailing whitespace is dropped;
        # the next mode's leading whitespace is dropped.
        self._trim[self._kind()].drop_held()
        self._in_reasoning = opening
        self._trim[self._kind()].strip_leading = True
        self._keep_apart(self._kind())

    def _keep_apart(self, kind: str) -> None:
        """Text of `kind` resumes after something was taken out of it (a stray tag, or a block
        of the other kind): the two sides must not join up into a new tag ("<th" + "ink>")."""
        if self._content_sent if kind == "content" else self._reasoning_text:
            self._trim[kind].separate = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    p.name: p for p in (ThinkReasoningParser, NoReasoningParser)
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; "
                         f"known: {sorted(REASONING_PARSERS)}") from None


def detect_reasoning_parser(chat_template: str | None) -> str:
    """``"think"`` if the chat template mentions ``<think>``, else ``"none"``."""
    return "think" if chat_template and "<think>" in chat_template else "none"


_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", re.S)


def template_starts_in_reasoning(chat_template: str | None,
                                 start_tag: str = "<think>", end_tag: str = "</think>") -> bool:
    """Heuristic: does the template's generation prompt open a reasoning block?

    Looks at the template text from the last mention of
    ``add_generation_prompt`` to its end (the generation-prompt branch, which
    templates put last) and returns True when a string literal there contains
    ``start_tag`` not followed by ``end_tag`` in the same literal. So
    DeepSeek-R1's ``'<｜Assistant｜><think>\\n'`` and Qwen3-Thinking's
    ``'<|im_start|>assistant\\n<think>\\n'`` count, Qwen3's
    ``'<think>\\n\\n</think>\\n\\n'`` (thinking switched off) does not.
    """
    if not chat_template:
        return False
    at = chat_template.rfind("add_generation_prompt")
    if at < 0:
        return False
    for m in _LITERAL.finditer(chat_template, at):
        lit = m.group(1) if m.group(1) is not None else m.group(2)
        i = lit.rfind(start_tag)
        if i >= 0 and lit.find(end_tag, i) < 0:
            return True
    return False
