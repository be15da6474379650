"""Prompt lookup, the drafter that costs nothing: the longest n-gram ending a sequence that occurred earlier in it,
and the tokens that followed its latest earlier occurrence (llama.cpp's `--spec-type ngram`, vLLM's `ngram`).
Replies that quote their prompt (code edits, repeated lists, tool results) are drafted right. The other drafter
is a draft model (draft_model.py); what is verified of their proposals is speculation.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a name only: speculation.py imports this module
    from .speculation import DraftAsk


class NgramDrafter:
    """Prompt lookup: the longest n-gram (ngram_max down to ngram_min tokens) ending the sequence that occurred
    earlier in it, and the tokens that followed its latest earlier occurrence. Replies that quote their prompt
    (code edits, repeated lists, tool results) are drafted right."""

    cheap = True

    def __init__(self, ngram_max: int = 3, ngram_min: int = 2) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = max(1, ngram_min)

    def sequence(self) -> NgramIndex:
        return NgramIndex(self.ngram_max, self.ngram_min)

    def propose_all(self, asks: list[DraftAsk]) -> list[list[int]]:
        return [ask.state.propose(ask.tokens, ask.last, ask.k) for ask in asks]

    def seconds_per_token(self) -> float:
        return 0.0

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """One lookup on a whole sequence (tests, one-off use)."""
        return self.sequence().propose(tokens[:-1], tokens[-1], k) if tokens else []


class NgramIndex:
    """One sequence's n-grams, each mapped to where its latest occurrence ends, kept up to date as the sequence
    grows: a lookup costs O(ngram_max) however long the context, where a scan would cost the whole context per
    step (at one stream, a step is a few milliseconds). Only the last `window` to 2 x `window` tokens are
    indexed, which bounds its memory for long contexts."""

    def __init__(self, ngram_max: int, ngram_min: int, window: int = 4096) -> None:
        self.ngram_max, self.ngram_min, self.window = ngram_max, ngram_min, window
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in _ends
        self._start = 0    # and none that starts before this one

    def _index(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self._indexed or len(tokens) - self._start > 2 * self.window:
            # Not the sequence this index was built on, or past its window: indexed again from the window.
            self._ends, self._start = {}, max(0, len(tokens) - self.window)
            self._indexed = self._start
        for end in range(self._indexed, len(tokens)):
            for n in range(self.ngram_min, min(self.ngram_max, end + 1 - self._start) + 1):
                self._ends[tuple(tokens[end - n + 1:end + 1])] = end
        self._indexed = len(tokens)

    def propose(self, tokens: Sequence[int], last: int, k: int) -> list[int]:
        if k <= 0:
            return []
        self._index(tokens)  # every n-gram ending before `last`: an earlier occurrence of the suffix
        for n in range(min(self.ngram_max, len(tokens) + 1), self.ngram_min - 1, -1):
            end = self._ends.get((*tokens[len(tokens) - n + 1:], last))
            if end is not None:
                follows = list(tokens[end + 1:end + 1 + k])
                return follows if len(follows) == k else [*follows, last][:k]
        return []
