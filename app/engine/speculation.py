"""Speculative decoding's drafting side: what a sequence proposes to verify, and how much it proposes.

A `Drafter` proposes the tokens likely to follow a sequence; the engine (engine.py, `_fill_batch` and
`_verify`) puts `[last token, drafts...]` into the step's batch with logits at every row, samples each row with
the request's own sampler, and keeps the drafts up to the first one the sampler did not pick. Prompt lookup
(`NgramDrafter`) is the drafter here; a draft model plugs in behind the same `propose`.

`DraftBudget` is one sequence's draft length: it follows the sequence's acceptance, so a reply that stops
copying (free writing) soon drafts nothing and pays for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# After this many verifications in a row with nothing accepted, a sequence stops drafting for a while.
MISSES_BEFORE_PAUSE = 2
PAUSE_STEPS_MAX = 64  # the longest pause (steps), doubling from 4 with each further miss


class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens likely to follow `tokens` (a sequence's prompt and output so far); [] for none.
        Deterministic for given tokens: the acceptance rule's exactness rests on it (engine.py, `_verify`)."""
        ...


class NgramDrafter:
    """Prompt lookup: the longest recent n-gram (ngram_max down to ngram_min tokens) ending the sequence that
    occurred earlier in it, and the tokens that followed its latest earlier occurrence. Replies that quote
    their prompt (code edits, repeated lists, tool results) are drafted right."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 2, window: int = 4096) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = max(1, ngram_min)
        self.window = window  # how far back to look: bounds the cost of a step for long contexts

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        seq = list(tokens[-self.window:])
        n_tokens = len(seq)
        last = seq[-1] if seq else None
        # Positions (latest first) holding the last token, before the end: each may end an earlier n-gram.
        ends = [i for i in range(n_tokens - 2, -1, -1) if seq[i] == last]
        for n in range(min(self.ngram_max, n_tokens - 1), self.ngram_min - 1, -1):
            key = seq[n_tokens - n:]
            for end in ends:
                start = end - n + 1
                if start >= 0 and seq[start:end + 1] == key:
                    return seq[end + 1:end + 1 + k]
        return []


@dataclass
class DraftBudget:
    """One sequence's draft length. Starts at n_max; after a verification it is the accepted run plus one
    (doubling after a run accepted whole), at least 1; after MISSES_BEFORE_PAUSE verifications in a row with
    nothing accepted, the sequence drafts nothing for a pause that doubles with each further miss. Proposals
    shorter than n_min are not verified (llama-server's `speculative.n_min`)."""

    n_max: int
    n_min: int = 0
    k: int = 0
    misses: int = 0
    pause: int = 0
    drafted: int = 0   # draft tokens verified, over the sequence's life
    accepted: int = 0  # of those, accepted

    def __post_init__(self) -> None:
        self.k = self.n_max

    def length(self) -> int:
        """How many tokens to propose this step (0: none); counts down a pause."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def verified(self, proposed: int, accepted: int) -> None:
        self.drafted += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k, self.misses = min(self.n_max, max(1, 2 * self.k)), 0
        elif accepted == 0:
            self.k = max(1, self.k // 2)
            self.misses += 1
            if self.misses >= MISSES_BEFORE_PAUSE:
                self.pause = min(PAUSE_STEPS_MAX, 4 << (self.misses - MISSES_BEFORE_PAUSE))
        else:
            self.k, self.misses = min(self.n_max, accepted + 1), 0


@dataclass
class SpecCounters:
    """The engine's totals, under vLLM's meaning: a draft is one verification of a sequence's proposal."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted_tokens}
