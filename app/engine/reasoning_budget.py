"""A generation's reasoning, followed token by token: where it opens and closes, how many tokens it took, and when
its budget is spent.

The reply is read the way its reply parser reads it (app/parsers/reasoning.py, `think`): text between the start
marker and the end marker is reasoning, wherever it is; a reply whose prompt opened the marker (the template's
generation prompt ends inside `<think>`) starts inside it. The markers are found in the generated text, so they
may be one control token (Qwen3's `</think>`) or several ordinary ones (a model whose vocabulary has none).

The budget counts the model's own tokens inside the reasoning. When it is spent and the reasoning is still open,
the engine takes the closing tokens instead of sampling (engine.py, `_sample`): the configured message, then the
end marker, through the sampler's state, the stop matching and the KV as the model's own tokens would go; the
answer follows. A budget of 0 closes at once, with the marker alone (nothing was thought to conclude). Reasoning
opened again after its budget was spent is closed at once, with the marker alone.

`tokens` counts every generated token that touched the reasoning (its markers, the forced close): the reply's
`reasoning_tokens`, exact because it is counted where the tokens are made, not guessed from the text.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable

from .params import ReasoningLimit

UNBOUNDED = 1 << 30  # draft room where no budget applies


class ReasoningTracker:
    """One generation's reasoning (one choice's). `close_tokens` are the message's tokens then the end marker's;
    `marker_tokens` the end marker's alone."""

    __slots__ = ("limit", "close_tokens", "marker_tokens", "inside", "closing", "closed_once", "spent", "tokens",
                 "_tail", "_keep")

    def __init__(self, limit: ReasoningLimit, close_tokens: list[int], marker_tokens: list[int]) -> None:
        self.limit = limit
        self.close_tokens = close_tokens
        self.marker_tokens = marker_tokens
        self.inside = limit.starts_open
        self.closing = False      # the close is being taken (forced), not yet complete
        self.closed_once = False  # a forced close happened (a second one is the marker alone)
        self.spent = 0            # the model's own tokens inside the reasoning: what the budget counts
        self.tokens = 0           # tokens that touched the reasoning: the reply's reasoning_tokens
        self._tail = ""           # the end of the text read, where a marker cut across tokens begins
        self._keep = max(len(limit.start), len(limit.end)) - 1

    def due(self) -> bool:
        """The budget is spent while the reasoning is open, and no close is under way: the next tokens close it."""
        budget = self.limit.budget
        return self.inside and not self.closing and budget is not None and self.spent >= budget

    def closing_tokens(self) -> list[int]:
        """What closes the reasoning now (and marks the close as under way): the message and the marker, or the
        marker alone where nothing was thought (a budget of 0) or a close was forced already."""
        full = self.limit.budget and not self.closed_once and self.limit.message
        self.closing = self.closed_once = True
        return list(self.close_tokens if full else self.marker_tokens)

    def draft_room(self) -> int:
        """How many draft tokens a step may verify for this sequence without the budget running out inside
        them (each verified row samples one token more): the budget's tokens left, less the step's own."""
        budget = self.limit.budget
        if not self.inside or budget is None:
            return UNBOUNDED
        return max(0, budget - self.spent - 1)

    def took(self, text: str) -> bool:
        """A token was taken (sampled or forced) whose text is `text` (UTF-8 decoded so far); True when it left
        the reasoning (its end marker completed)."""
        was = self.inside
        window = self._tail + text
        at = 0
        left = False
        while True:
            tag = self.limit.end if self.inside else self.limit.start
            i = window.find(tag, at)
            if i < 0:
                break
            self.inside = not self.inside
            left = left or not self.inside
            at = i + len(tag)
        self._tail = window[max(at, len(window) - self._keep):] if self._keep else ""
        if was or self.inside or left:
            self.tokens += 1
        if was and self.inside and not self.closing:
            self.spent += 1
        if not self.inside:
            self.closing = False
        return left

    def replay(self, texts: Iterable[str]) -> int | None:
        """Tokens generated in an earlier round of this reply (a continued reply), read again so the budget goes
        on where it was; their reasoning is not this round's to count. The index after the token that first left
        the reasoning (where an answer's grammar starts), 0 if the reply did not start inside it, None if it never
        left."""
        answer_at = None if self.inside else 0
        for i, text in enumerate(texts):
            if self.took(text) and answer_at is None:
                answer_at = i + 1
        self.tokens = 0
        return answer_at


def token_texts(tokens: Iterable[int], piece: Callable[[int], bytes]) -> list[str]:
    """Each token's text as a generation's decoder gives it (a character cut across tokens comes with its last)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return [decoder.decode(piece(t)) for t in tokens]
