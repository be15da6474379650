"""Speculative decoding's drafting side: what a sequence proposes to verify, and whether verifying pays.

A `Drafter` proposes the tokens likely to follow each drafting sequence of a step (`propose_all`); the engine
(engine.py, `_fill_batch` and `_verify`) puts `[last token, drafts...]` into the step's batch with logits at every
row, samples each row with the request's own sampler, and keeps the drafts up to the first one the sampler did not
pick. Prompt lookup (`NgramDrafter`) and a draft model (draft_model.py) are the drafters.

Whether to verify, and how many: `DraftBudget` keeps one sequence's acceptance (the drafts it verified, and the
proposals it did not verify checked against the tokens it then generated: free to measure), and `StepCost` the
decode time of a step by its rows, measured on the engine's own context. A sequence verifies the k drafts that
maximise the tokens it expects to gain minus what the k extra rows cost, in tokens at the step's own rate. On a
GPU rows are nearly free and a sequence drafts whenever it has a proposal; on a CPU a row costs most of a token
and only a reply that copies almost exactly pays (docs/benchmarks.md), so free writing soon drafts nothing.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# Acceptance is a decayed count of draft tokens picked and not picked: about the last 1/(1-DECAY) tokens.
DECAY = 0.95
PRIOR = 1.0  # one pick and one miss to start from (an acceptance of 1/2)
# A drafter whose proposals cost decodes (a draft model) is asked for a short proposal (PROBE_TOKENS) now and then
# where drafts do not pay at the acceptance measured but would at a better one, so that the watched proposal keeps
# the acceptance current: after PROBE_STEPS steps, then twice as long after each probe that finds it still not
# worth it, up to PROBE_MAX_STEPS. A probe costs the draft's catching up with the sequence and its proposal.
PROBE_STEPS = 16
PROBE_MAX_STEPS = 512
PROBE_TOKENS = 2


class SequenceDrafter(Protocol):
    def propose(self, tokens: Sequence[int], last: int, k: int) -> list[int]:
        """Up to `k` tokens likely to follow `[*tokens, last]` (a sequence's prompt and output so far); [] for
        none. Deterministic for given tokens: the acceptance rule's exactness rests on it (engine.py, `_verify`).
        `tokens` only grows between calls for one sequence."""
        ...


@dataclass
class DraftAsk:
    """One sequence's request for proposals in a step: its KV sequence (the slot), the tokens it holds, the
    token sampled last (not yet decoded), how many to propose, and its drafting state (Drafter.sequence)."""

    seq: int
    tokens: Sequence[int]
    last: int
    k: int
    state: Any = None


class Drafter(Protocol):
    cheap: bool  # whether proposing costs next to nothing (no decode): then every step proposes

    def sequence(self) -> Any:
        """The drafting state of one new sequence (DraftAsk.state)."""
        ...

    def propose_all(self, asks: list[DraftAsk]) -> list[list[int]]:
        """Each ask's proposals, in order (the step's drafting sequences together: a draft model decodes them
        in one batch). Deterministic for given tokens (engine.py, `_verify`)."""
        ...

    def seconds_per_token(self) -> float:
        """What proposing one token costs the step (0 for a lookup)."""
        ...


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


class StepCost:
    """A decode step's time by its rows (tokens in the batch, logits at each), from timings on the engine's own
    context: piecewise linear between measured sizes, the last slope beyond them."""

    def __init__(self, seconds_by_rows: dict[int, float]) -> None:
        points = sorted(seconds_by_rows.items())
        if not points:
            raise ValueError("StepCost needs at least one timing")
        self._rows = [r for r, _ in points]
        self._s = [s for _, s in points]

    @classmethod
    def flat(cls) -> StepCost:
        """Rows are free (a GPU's step, or a test that wants every proposal verified)."""
        return cls({1: 1.0, 2: 1.0})

    @classmethod
    def measure(cls, decode_rows: Callable[[int], None], sizes: Sequence[int], repeats: int = 2) -> StepCost:
        """`decode_rows(n)` decodes a batch of n rows (and undoes it); each size timed `repeats` times after
        one warm-up, keeping the fastest."""
        decode_rows(sizes[0])
        timings = {}
        for n in sizes:
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                decode_rows(n)
                best = min(best, time.perf_counter() - t0)
            timings[n] = best
        return cls(timings)

    def seconds(self, rows: int) -> float:
        r, s = self._rows, self._s
        if len(r) == 1:
            return s[0] * rows / r[0]
        i = min(max(bisect.bisect_left(r, rows), 1), len(r) - 1)
        slope = (s[i] - s[i - 1]) / (r[i] - r[i - 1])
        return max(s[i - 1] + slope * (rows - r[i - 1]), 1e-9)

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self._rows, self._s))


@dataclass
class DraftBudget:
    """One sequence's drafting: its acceptance and how many drafts it verifies in a step.

    `adaptive` (the default): the k (up to n_max and the proposal) that maximises the expected tokens gained,
    p + p^2 + ... + p^k for an acceptance p, minus the rows' cost in tokens at the step's own rate; 0 when no k
    gains. Not adaptive: every proposal is verified, up to n_max. Proposals shorter than n_min are never verified
    (llama-server's `speculative.n_min`)."""

    n_max: int
    n_min: int = 0
    adaptive: bool = True
    picked: float = PRIOR   # decayed count of draft tokens the sampler picked
    missed: float = PRIOR   # and of those it did not
    drafted: int = 0        # draft tokens verified, over the sequence's life
    accepted: int = 0       # of those, accepted
    watching: list[int] = field(default_factory=list)  # a proposal not verified, checked against what follows
    declined: int = 0       # steps in a row it was not asked for proposals (a costly drafter's probe)
    probe_every: int = PROBE_STEPS

    @property
    def acceptance(self) -> float:
        return self.picked / (self.picked + self.missed)

    def tokens_to_ask(self, k: int, cost: StepCost, rows: int, sequences: int, draft_s: float) -> int:
        """How many tokens a costly drafter should propose this step (0: none): `k` where drafts may pay; a
        probe's PROBE_TOKENS now and then (PROBE_STEPS, doubling) where they would pay at a better acceptance;
        never where even an acceptance of 1 would not pay (a draft as slow as its target, a CPU's rows)."""
        if self.length(k, cost, rows, sequences, draft_s) > 0:
            self.declined, self.probe_every = 0, PROBE_STEPS
            return k
        if self.length(k, cost, rows, sequences, draft_s, acceptance=1.0) == 0:
            return 0
        self.declined += 1
        if self.declined < self.probe_every:
            return 0
        self.declined, self.probe_every = 0, min(2 * self.probe_every, PROBE_MAX_STEPS)
        return min(k, PROBE_TOKENS)

    def length(self, proposed: int, cost: StepCost, rows: int, sequences: int, draft_s: float = 0.0,
               acceptance: float | None = None) -> int:
        """How many of `proposed` draft tokens to verify in a step of `rows` rows (before these) that
        emits a token for each of `sequences` sequences, where proposing costs `draft_s` a token; at the
        sequence's measured acceptance, or at `acceptance`."""
        k_max = min(proposed, self.n_max)
        if k_max < max(1, self.n_min):
            return 0
        if not self.adaptive:
            return k_max
        base = cost.seconds(rows)
        rate = sequences / base  # tokens per second of this step without drafts
        p = self.acceptance if acceptance is None else acceptance
        expected, best, best_gain = 0.0, 0, 0.0
        for k in range(1, k_max + 1):
            expected += p ** k
            gain = expected - rate * (cost.seconds(rows + k) - base + k * draft_s)
            if gain > best_gain and k >= self.n_min:
                best, best_gain = k, gain
        return best

    def _observe(self, picked: int, missed: int) -> None:
        for _ in range(picked):
            self.picked = DECAY * self.picked + 1
            self.missed *= DECAY
        for _ in range(missed):
            self.missed = DECAY * self.missed + 1
            self.picked *= DECAY

    def verified(self, proposed: int, accepted: int) -> None:
        """A verification: the first `accepted` of `proposed` drafts were picked."""
        self.drafted += proposed
        self.accepted += accepted
        self._observe(accepted, int(accepted < proposed))
        self.watching = []

    def watch(self, proposal: list[int]) -> None:
        """A proposal this step did not verify: the tokens the sequence generates next are checked against it."""
        self.watching = proposal

    def generated(self, token: int) -> None:
        """The sequence's next token (sampled without drafts): a pick or a miss for the proposal watched."""
        if not self.watching:
            return
        if token == self.watching[0]:
            self._observe(1, 0)
            self.watching = self.watching[1:]
        else:
            self._observe(0, 1)
            self.watching = []


@dataclass
class SpecCounters:
    """The engine's totals, under vLLM's meaning: a draft is one verification of a sequence's proposal."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted_tokens}
