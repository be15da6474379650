"""Which waiting requests go into idle slots now: first come, first served, with backfill.

A request for n choices needs n idle slots at once. Served strictly in order, one waiting for slots it
cannot have yet would hold back every request behind it, even ones that fit in the slots that sit idle
meanwhile. So smaller requests behind it are admitted into those slots (backfill), but only until the
blocked request has waited `backfill_s`: from then on nothing behind it is admitted, so slots freed by
the generations that end are its, and it waits at most `backfill_s` plus the end of the generations
running by then (the ones it let in included).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

# How long a request blocked for slots lets later, smaller ones take idle slots before it. A second is
# a dozen engine steps on a busy 2-core machine (70-85 ms a step over 16 sequences), more on a GPU:
# enough for a burst of small requests that arrives behind a large one to start at once, while the
# large one's extra wait stays a second plus the generations it let in.
BACKFILL_S = 1.0

# Requests that may wait for a slot, per slot, where no Serve queue stands in front of the engine (the
# Ingress hosting it): serve_config.yaml's max_queued_requests 64 for 16 slots. Beyond, 503 + Retry-After.
# One request's own generations (a legacy request's prompts) are bounded by it in every topology.
WAITING_PER_SLOT = 4


class Waiting(Protocol):
    queued_at: float

    @property
    def slots_needed(self) -> int: ...


def admissible(waiting: Iterable[Waiting], idle: int, now: float, backfill_s: float = BACKFILL_S) -> list[Waiting]:
    """The requests of `waiting` (oldest first) to admit into `idle` slots at monotonic time `now`."""
    taken = []
    for req in waiting:
        if idle <= 0:
            break
        if req.slots_needed <= idle:
            taken.append(req)
            idle -= req.slots_needed
        elif now - req.queued_at >= backfill_s:
            break  # it waited long enough: the slots that free up from now on are its
    return taken
