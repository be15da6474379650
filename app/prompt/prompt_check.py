"""After rendering: the control tokens of a chat prompt are exactly those its template writes.

Content marks (content_marks) keep client text out of the control tokens by construction; this
check holds whatever a template does with the marks. The engine tokenizes the prompt's template
runs with special-token parsing and its marked runs without, so the control tokens it will find are
those whose texts occur in template runs (llama.cpp's partition: longest texts first). The same
request rendered once more with every control-token text cut out of every client string (and ids
replaced by inert ones of the same length, so a raw id cannot complete a control token next to
template text) is the neutral render: it takes the template's branches and writes only the
template's own control tokens. Both sequences must be equal, or the request's text would become
control tokens with this template: a 400.

When no client string holds a control-token text (and the request has no ids), the neutral render
would be the prompt itself, so it is skipped: the check then costs one scan of the client strings.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from typing import Any

from ..api import strict_json
from ..api.errors import APIError, invalid_request
from . import content_marks
from .chat_template import render_prompt

# What a control-token text in a client string becomes in the neutral render: a noncharacter that no
# vocabulary's control token contains, so the cut cannot join its two sides into a new one.
_CUT = "\ufdd2"


def _trie_pattern(texts: list[str]) -> str:
    """One regex alternation of `texts` shaped as a trie (linear in the text, however many tokens:
    Llama 3 has 256 control tokens); at one position the longest text matches."""
    trie: dict[str, Any] = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}

    def render(node: dict[str, Any]) -> str:
        ends = "" in node
        branches = [re.escape(ch) + render(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if ends else body

    return render(trie)


class ControlTexts:
    """A vocabulary's control-token texts, compiled for finding them."""

    def __init__(self, texts: tuple[str, ...]) -> None:
        self.texts = sorted({t for t in texts if t}, key=len, reverse=True)  # llama.cpp's order
        self.pattern = re.compile(_trie_pattern(self.texts)) if self.texts else None
        self._anywhere = re.compile(f"(?=({self.pattern.pattern}))") if self.pattern is not None else None

    def cut(self, text: str) -> str:
        return self.pattern.sub(_CUT, text) if self.pattern is not None else text

    def tokens_in(self, prompt: str) -> list[str]:
        """The control tokens the engine finds in a marked prompt, in order (template runs only)."""
        out: list[str] = []
        if self.pattern is None:
            return out
        for text, is_content in content_marks.split(prompt):
            if not is_content and self.pattern.search(text):
                out += self._partition(text)
        return out

    def _partition(self, text: str) -> list[str]:
        # llama.cpp's tokenizer_st_partition: each special text, longest first, claims its
        # occurrences (left to right) in the fragments not yet claimed.
        present = {m.group(1) for m in self._anywhere.finditer(text)}
        fragments: list[tuple[str, bool]] = [(text, False)]
        for token in self.texts:
            if token not in present:
                continue
            split: list[tuple[str, bool]] = []
            for fragment, is_token in fragments:
                if is_token or token not in fragment:
                    split.append((fragment, is_token))
                    continue
                for i, piece in enumerate(fragment.split(token)):
                    if i:
                        split.append((token, True))
                    if piece:
                        split.append((piece, False))
            fragments = split
        return [fragment for fragment, is_token in fragments if is_token]


@lru_cache(maxsize=16)
def control_texts(texts: tuple[str, ...]) -> ControlTexts:
    return ControlTexts(texts)


class _Neutral:
    """The neutral request: every string and key of the client's request, at any depth (tool-call
    arguments parsed), with control-token texts cut out; ids that templates get raw replaced by
    inert ones. It walks the request itself, not the marking, so a string the marking misses is
    neutralized all the same."""

    def __init__(self, controls: ControlTexts) -> None:
        self.controls = controls
        self.changed: set[str] = set()
        self.ids: dict[str, str] = {}

    def request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        return self._walk(messages, "messages"), self._walk(tools, "tools")

    def _walk(self, v: Any, scope: str) -> Any:
        if isinstance(v, str):
            return self._text(v, scope)
        if isinstance(v, list):
            return [self._walk(x, scope) for x in v]
        if not isinstance(v, dict):
            return v
        out = {}
        for key, x in v.items():
            if key in ("id", "tool_call_id") and isinstance(x, str) and content_marks.is_plain_id(content_marks.clean(x)):
                out[key] = self._id(content_marks.clean(x), scope)
            elif key == "arguments" and isinstance(x, str):
                out[key] = self._arguments(x, scope)
            else:
                out[self._text(key, scope) if isinstance(key, str) else key] = self._walk(x, scope)
        return out

    def _text(self, s: str, scope: str) -> str:
        cut = self.controls.cut(s)
        if cut != s:
            self.changed.add(scope)
        return cut

    def _arguments(self, text: str, scope: str) -> str:
        try:
            value = strict_json.loads(text)
        except json.JSONDecodeError:
            return self._text(text, scope)
        return strict_json.dumps(self._walk(value, scope), compact=False)

    def _id(self, s: str, scope: str) -> str:
        # Letters and digits replaced by digits, separators kept: the same length and shape (templates
        # check the length, or slice at `.` and `:`), one per distinct id (templates pair calls and
        # results), and nothing left that could complete a control token next to template text.
        if s not in self.ids:
            slots = [i for i, ch in enumerate(s) if ch.isalnum()]
            chars = ["0" if ch.isalnum() else ch for ch in s]
            for i, digit in zip(reversed(slots), reversed(str(len(self.ids)))):
                chars[i] = digit
            self.ids[s] = "".join(chars)
        self.changed.add(scope)
        return self.ids[s]


def checked_prompt(source: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                   add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                   control_tokens: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> str:
    """The marked prompt (render_prompt with mark_content), checked: a 400 when the request's text
    would become control tokens of this model (`control_tokens`: ModelSpec.control_tokens). `extra`:
    more template variables (`reasoning_effort`)."""
    kw = dict(tools=tools, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token,
              mark_content=True, extra=extra)
    prompt = render_prompt(source, messages, **kw)
    if not control_tokens:
        return prompt
    controls = control_texts(tuple(control_tokens))
    neutral = _Neutral(controls)
    neutral_messages, kw["tools"] = neutral.request(messages, tools)
    if not neutral.changed:
        return prompt  # the neutral render would be this very prompt
    try:
        expected = controls.tokens_in(render_prompt(source, neutral_messages, **kw))
    except APIError:
        expected = None  # the template refuses the neutral request: nothing to compare with
    found = controls.tokens_in(prompt)
    if found != expected:
        raise _injection(found, expected or [], "messages" if "messages" in neutral.changed else "tools")
    return prompt


def _injection(found: list[str], expected: list[str], param: str) -> APIError:
    extra = Counter(found) - Counter(expected)
    lost = Counter(expected) - Counter(found)
    named = ", ".join(f"`{t}`" for t in list(extra or lost)[:3])
    return invalid_request(
        f"The request's text would become control tokens ({named}) in this model's prompt with its chat "
        f"template; control-token text in `{param}` cannot be sent to this model.",
        param=param, code="control_token_injection")
