"""One generation's moments as its model replica sees them: arrival, admission to a slot (the engine's own
measure of the wait), first text, end, for each choice. Read at the end for the metrics under vLLM's names
(deployments/metrics.py) and the model tier's spans (app/observe/tracing.py).

Each choice counts as one request, as vLLM counts the n children of a request: its own first token, end,
tokens and finish reason, the shared prompt counted with each."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from .events import Event, Finished, Started, Text

ABORT, ERROR = "abort", "error"  # vLLM's finish reasons for a generation that did not finish


@dataclass
class ChoiceTimes:
    """Monotonic times (time.monotonic) of one choice; None: not reached."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    queued_s: float = 0.0           # submitted -> admitted to a slot, as the engine measured it
    admitted_at: float | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    tokens: int = 0
    finish_reason: str | None = None  # stop, length; abort (cancelled) or error when it did not finish
    cached_from: str = ""  # where its reused KV came from (slot, memory, disk, cluster)


@dataclass(frozen=True)
class ChoiceStats:
    """One admitted choice's durations (seconds) and counts: what vLLM observes per finished request."""

    prompt_tokens: int
    cached_tokens: int
    generation_tokens: int
    finish_reason: str
    queue_s: float
    inference_s: float         # admitted -> end
    e2e_s: float               # arrival at the replica -> end
    ttft_s: float | None       # arrival -> first token
    prefill_s: float | None    # admitted -> first token
    decode_s: float | None     # first token -> end
    tpot_s: float | None       # decode time per token after the first


class Timeline:
    def __init__(self) -> None:
        self.arrived = time.monotonic()
        self._wall_ns = time.time_ns()
        self.ended: float | None = None
        self.choices: dict[int, ChoiceTimes] = {}

    def ns(self, t: float) -> int:
        """Monotonic time `t` as wall-clock nanoseconds (what spans carry)."""
        return self._wall_ns + int((t - self.arrived) * 1e9)

    def feed(self, events: list[Event]) -> None:
        now = time.monotonic()
        for ev in events:
            if isinstance(ev, Started):
                self.choices[ev.index] = ChoiceTimes(ev.prompt_tokens, ev.cached_tokens, ev.queued_s, now,
                                                     cached_from=ev.cached_from)
                continue
            choice = self.choices.get(getattr(ev, "index", 0))
            if choice is None:
                continue
            if isinstance(ev, Text):
                if choice.first_token_at is None:
                    choice.first_token_at = now
                choice.tokens += ev.tokens
            elif isinstance(ev, Finished):
                choice.ended_at, choice.tokens, choice.finish_reason = now, ev.completion_tokens, ev.finish_reason

    def close(self, failure: BaseException | None = None) -> None:
        """The generation is over: choices still going end now, cancelled (`abort`) or failed (`error`)."""
        self.ended = time.monotonic()
        reason = ABORT if failure is None or isinstance(failure, (asyncio.CancelledError, GeneratorExit)) else ERROR
        for choice in self.choices.values():
            if choice.ended_at is None:
                choice.ended_at, choice.finish_reason = self.ended, reason

    def stats(self) -> list[ChoiceStats]:
        """Each admitted choice's figures (call after close)."""
        out = []
        for c in self.choices.values():
            end = c.ended_at if c.ended_at is not None else time.monotonic()
            first = c.first_token_at
            decode = end - first if first is not None else None
            out.append(ChoiceStats(
                prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens, generation_tokens=c.tokens,
                finish_reason=c.finish_reason or ABORT, queue_s=c.queued_s, inference_s=end - c.admitted_at,
                e2e_s=end - self.arrived, ttft_s=first - self.arrived if first is not None else None,
                prefill_s=first - c.admitted_at if first is not None else None, decode_s=decode,
                tpot_s=decode / (c.tokens - 1) if decode is not None and c.tokens > 1 else None))
        return out
