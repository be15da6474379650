"""Speculative decoding's drafting side: what a sequence proposes to verify, and whether verifying pays.

A `Drafter` proposes the tokens likely to follow each drafting sequence of a step (`propose_all`); `Speculation`
chooses which to verify (`choose`), the engine (engine.py, `_fill_batch`) puts `[last token, drafts...]` into the
step's batch with logits at every row, and `verify` samples each row with the request's own sampler and keeps the
drafts up to the first one the sampler did not pick. Prompt lookup (prompt_lookup.py) and a draft model
(draft_model.py) are the drafters.

Whether to verify, and how many: `DraftBudget` keeps one sequence's acceptance (the drafts it verified, and the
proposals it did not verify checked against the tokens it then generated: free to measure), and `StepCost` the
decode time of a step by its rows, measured on the engine's own context. A sequence verifies the k drafts that
maximise the tokens it expects to gain minus what the k extra rows cost, in tokens at the step's own rate. On a
GPU rows are nearly free and a sequence drafts whenever it has a proposal; on a CPU a row costs most of a token,
so a sequence drafts mostly where its reply copies (free writing drafts about one token in ten; measured in
docs/benchmarks.md, bench.spec).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("llamaray.engine")

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


class Speculation:
    """An engine's speculative decoding: its drafter (prompt lookup, or a draft model loaded beside the target),
    the step cost its budgets weigh drafts against (timed on the target's context before it serves when drafting
    is adaptive), each request's draft budget, the drafts a step verifies (`choose`) and their verification by the
    request's own sampler (`verify`). Used from the decode thread, but for `budget` (any thread)."""

    def __init__(self, settings: Any, spec: Any, llama: Any, batch: Any) -> None:
        self.settings = settings  # the model's SpeculativeSpec
        self.llama = llama
        self.counters = SpecCounters()
        self.step_cost = StepCost.flat()
        self.drafter = self._load_drafter(spec, llama)
        if settings.adaptive:
            try:
                self.step_cost = self._measure_step_cost(spec, batch)
            except BaseException:
                self.close()
                raise

    def _load_drafter(self, spec: Any, llama: Any) -> Drafter:
        if self.settings.type != "draft":
            from .prompt_lookup import NgramDrafter

            return NgramDrafter(self.settings.ngram_max, self.settings.ngram_min)
        from . import hardware
        from .draft_model import DraftModel

        draft = DraftModel(self.settings.draft_path, target_vocab=llama.n_vocab, n_ctx_per_seq=spec.n_ctx,
                           n_seq_max=spec.n_seq_max, n_batch=spec.n_batch, n_threads=spec.n_threads,
                           n_threads_batch=spec.n_threads_batch, n_gpu_layers=spec.n_gpu_layers,
                           kv_unified=spec.kv_unified, extra_buffers=hardware.use_extra_buffers(
                               spec.cpu_extra_buffers, hardware.system_info()))
        if self.settings.adaptive:
            try:
                draft.measure()
            except BaseException:
                draft.close()
                raise
        log.info("model %s: draft model %s loaded", spec.id, self.settings.draft_path)
        return draft

    def _measure_step_cost(self, spec: Any, batch: Any) -> StepCost:
        """The decode time of a step by its rows (logits at each, as a verification has), timed on this context
        before it serves (about 0.5 s on 2 CPU cores, milliseconds on a GPU): what an adaptive draft weighs its
        expected gain against. Where it cannot be timed, rows are taken to cost as a token each, and adaptive
        drafting then verifies nothing."""
        from .llama import decode

        llama, settings = self.llama, self.settings
        most = min(batch.capacity, spec.n_ctx - 1, settings.max_sequences * (settings.n_max + 1))
        sizes = sorted({min(n, most) for n in (1, 2, 4, 8, 16, 32, 64) if n <= max(most, 1)} | {max(most, 1)})
        token = llama.tokenize_prompt(" the", False)[-1]

        def decode_rows(n: int) -> None:
            batch.clear()
            for pos in range(n):
                batch.add(token, pos, 0, True)
            try:
                if decode(llama, batch) != 0:
                    raise RuntimeError(f"llama_decode failed on {n} rows")
            finally:
                llama.seq_rm(0, 0, -1)
                batch.clear()

        try:
            cost = StepCost.measure(decode_rows, sizes)
        except Exception:  # noqa: BLE001 - speculation stays safe (off in effect), the model serves
            log.exception("model %s: could not time its decode steps; adaptive drafting verifies nothing", spec.id)
            return StepCost({1: 1.0, 2: 2.0})
        log.info("model %s: decode step by rows (ms) %s", spec.id,
                 {n: round(s * 1e3, 2) for n, s in cost.as_dict().items()})
        return cost

    def budget(self, req: Any) -> DraftBudget | None:
        """A generation's draft length, None where it never drafts: speculation off by the request, or a
        request's n_max of 0."""
        if not req.speculative:
            return None
        if self.settings.type == "draft" and req.images:
            return None  # the draft model would read an image's positions as its placeholder tokens
        n_max = req.spec_n_max if req.spec_n_max is not None else self.settings.n_max
        n_min = req.spec_n_min if req.spec_n_min is not None else self.settings.n_min
        return DraftBudget(n_max, n_min, self.settings.adaptive) if n_max > 0 else None

    def sequence(self) -> Any:
        """A new sequence's drafting state (prompt lookup's n-gram index)."""
        return self.drafter.sequence()

    def drafting(self, sequences: int) -> bool:
        """Whether a step of `sequences` generating sequences drafts: a large batch is efficient on its own, and
        drafts cost it more than they give (max_sequences)."""
        return sequences <= self.settings.max_sequences

    def choose(self, generating: list[Any], room: int, n_ctx: int) -> dict[int, list[int]]:
        """The draft tokens each generating slot verifies this step (by slot index): up to what its n_max, the
        batch's `room`, its max_tokens, its context and its reasoning budget leave (each row samples one token
        more), as many as its budget finds worth their rows. A costly drafter (a draft model) is asked only for
        sequences whose drafts may pay, and now and then for a short probe. A proposal not verified is watched: the
        tokens generated next measure the acceptance it would have had."""
        cost, sequences, draft_s = self.step_cost, len(generating), self.drafter.seconds_per_token()
        rows = sequences
        asks: list[tuple[Any, DraftAsk]] = []
        for slot in generating:
            gen = slot.gen
            if gen.draft is None or gen.forced:
                continue  # a sequence taking forced tokens (a reasoning's close) has them in place of drafts
            k = min(gen.draft.n_max, room, gen.max_tokens - gen.generated - 1, n_ctx - gen.n_past - 2)
            if gen.reasoning is not None:
                k = min(k, gen.reasoning.draft_room())  # drafts never cross a reasoning budget
            if k > 0 and not self.drafter.cheap:
                k = gen.draft.tokens_to_ask(k, cost, rows, sequences, draft_s)
            if k > 0:
                asks.append((slot, DraftAsk(slot.index, slot.tokens, gen.last_token, k, gen.drafter)))
        if not asks:
            return {}
        chosen: dict[int, list[int]] = {}
        for (slot, _), proposal in zip(asks, self.drafter.propose_all([ask for _, ask in asks])):
            budget = slot.gen.draft
            n = min(budget.length(len(proposal), cost, rows, sequences, draft_s), room) if proposal else 0
            if n == 0:
                budget.watch(proposal)
                continue
            chosen[slot.index] = proposal[:n]
            room -= n
            rows += n
        return chosen

    def verify(self, slot: Any, tokens: list[int], sample: Callable[[Any], None]) -> None:
        """A generating sequence decoded with drafts (`tokens` is [last token, drafts...], logits at each row): row j
        is sampled with the request's own sampler (`sample(slot)`: grammar, logit bias, penalties, its RNG), exactly
        as the step after accepting drafts 1..j would have sampled it; the token is emitted through the per-token
        bookkeeping of the engine's sampling; if it is the next draft, that draft is accepted and row j+1 is
        sampled, otherwise the sampled token is this step's last. The drafter is deterministic given the tokens so
        far, so each emitted token is drawn from the target's distribution given the tokens before it: the output
        distribution is the model's own (greedy: its greedy tokens, up to the near-ties a batch of another shape
        may order differently), and a seeded request draws its RNG once per emitted token, as without drafts. The
        rejected drafts' KV is then cut."""
        gen = slot.gen
        drafts, gen.drafts = gen.drafts, []
        first = gen.logits_at
        slot.advanced(tokens[:1])
        accepted = 0
        for j in range(len(drafts) + 1):
            gen.logits_at = first + j
            sample(slot)
            if slot.gen is not gen or j == len(drafts) or gen.last_token != drafts[j]:
                break  # finished (stop, end of generation, a limit), failed, or the draft was not picked
            slot.advanced([drafts[j]])
            accepted += 1
        c = self.counters
        c.drafts, c.draft_tokens, c.accepted_tokens = c.drafts + 1, c.draft_tokens + len(drafts), \
            c.accepted_tokens + accepted
        gen.draft.verified(len(drafts), accepted)
        if accepted < len(drafts):
            # The KV past what the slot holds (its tokens: kept even when the request ended) is rejected drafts.
            self.llama.seq_rm(slot.index, len(slot.tokens), -1)

    def stats(self) -> dict[str, Any]:
        return {"spec_decode": self.counters.as_dict(),
                "spec_step_ms": {n: round(t * 1e3, 3) for n, t in self.step_cost.as_dict().items()}}

    def close(self) -> None:
        close = getattr(self.drafter, "close", None) if hasattr(self, "drafter") else None
        if close is not None:
            close()
