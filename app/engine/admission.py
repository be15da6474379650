"""Which waiting requests go into idle slots now: first come, first served, with backfill.

A request for n choices needs n idle slots at once. Served strictly in order, one waiting for slots it
cannot have yet would hold back every request behind it, even ones that fit in the slots that sit idle
meanwhile. So smaller requests behind it are admitted into those slots (backfill), but only until the
blocked request has waited `backfill_s`: from then on nothing behind it is admitted, so slots freed by
the generations that end are its, and it waits at most `backfill_s` plus the end of the generations
running by then (the ones it let in included).

Between keys (tenants), the queue is first put in fair-share order (`in_share_order`): the next slot goes
to the key holding the fewest slots per unit of its priority's weight (app/tenants/fair_share.py), first
come first served within a key. Admission then runs over that order as above, backfill included. With one
key waiting (a server without keys: every request's tenant is "") the order is the queue's own. And while a
key that used the model in the last minute has nothing running or waiting, one slot is held back from keys
that already hold one (`held_back`), so its next request starts at once instead of after another key's
whole generation; a key holding none may still take it.

Batch work (`GenerationRequest.batch`: a line of a batch job, app/batches/) takes only what interactive requests
leave (`BatchShare`): interactive requests are admitted first, and batch lines only while none waits; batch lines
hold at most the slots interactive requests did not use in the last `RESERVE_WINDOW_S` seconds (so a client's next
request finds its slot idle rather than behind a batch line); a running batch line gives its slot up (preempted:
its generation fails with a retryable 503, its KV kept) to an interactive request that waits for one; and a batch
line that waited `BATCH_WAIT_S` without a slot goes back to its runner (a 503 too), so it holds no place in a
queue in front of the engine (Serve's, in the graph) that an interactive request could have had.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..tenants.fair_share import fair_order
from .params import GenerationRequest

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


W = TypeVar("W", bound=Waiting)


class Queued(Protocol):
    req: GenerationRequest  # its tenant and weight
    choices: list  # the first choice's siblings: a request takes 1 + len(choices) slots


Q = TypeVar("Q", bound=Queued)


def in_share_order(waiting: Sequence[Q], held: Counter) -> Sequence[Q]:
    """`waiting` (oldest first) in the order slots should go to it, given the slots each tenant holds. The
    queue itself, untouched, while one tenant waits: the check is one pass over a queue of a few requests per
    slot, and the sort runs only when keys compete."""
    if not waiting:
        return waiting
    first = waiting[0].req.tenant
    if all(g.req.tenant == first for g in waiting):
        return waiting
    return fair_order(waiting, lambda g: g.req.tenant, lambda g: g.req.weight, held,
                      size_of=lambda g: 1 + len(g.choices))


# How long a key counts as one of the model's users after its last request: while such a key has nothing
# running or waiting, one slot is held back for it (held_back).
RECENT_S = 60.0


class RecentTenants:
    """The keys that sent the model a request in the last RECENT_S seconds (under the engine's lock)."""

    def __init__(self, window_s: float = RECENT_S) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}

    def saw(self, tenant: str, now: float) -> None:
        self._last[tenant] = now
        if len(self._last) > 64:  # forget the ones past the window, now and then
            self._last = {t: at for t, at in self._last.items() if now - at <= self.window_s}

    def recent(self, now: float) -> set[str]:
        return {t for t, at in self._last.items() if now - at <= self.window_s}


def held_back(recent: set[str], held: Counter, waiting: Iterable[Queued], slots: int) -> int:
    """Slots kept idle for a key that used the model lately and has nothing running or waiting now: 1, while
    the model has more than one slot; else 0. A queue order alone makes such a key's next request wait for a
    whole generation of another key's to end; one slot held back lets it start at the next step. A key alone
    (or a server without keys) has every slot. Only keys that already hold a slot are kept from it
    (`admissible`'s `reserve`): a key holding none takes it, or a request for every slot would wait out the
    other key's whole minute on an idle model."""
    if slots < 2 or len(recent) < 2:
        return 0
    busy = {t for t, n in held.items() if n} | {g.req.tenant for g in waiting}
    return 1 if recent - busy else 0


def admissible(waiting: Iterable[W], idle: int, now: float, backfill_s: float = BACKFILL_S, *, reserve: int = 0,
               tenant_of: Callable[[W], str] | None = None, holding: Iterable[str] = ()) -> list[W]:
    """The requests of `waiting` (in the order slots go to them) to admit into `idle` slots at monotonic time
    `now`. The last `reserve` idle slots go only to keys that hold no slot (`holding`, and the ones admitted
    here): a request kept from them alone does not stop the backfill behind it."""
    taken: list[W] = []
    holders = set(holding)
    for req in waiting:
        if idle <= 0:
            break
        key = tenant_of(req) if tenant_of is not None else None
        usable = idle - reserve if key in holders else idle
        if req.slots_needed <= usable:
            taken.append(req)
            idle -= req.slots_needed
            reserve = min(reserve, idle)
            if key is not None:
                holders.add(key)
        elif req.slots_needed <= idle:
            continue  # kept from the reserved slot only: the key already runs something
        elif now - req.queued_at >= backfill_s:
            break  # it waited long enough: the slots that free up from now on are its
    return taken


# How long interactive requests' peak demand for slots is kept from batch work: a closed loop of clients (each
# sending its next request as the previous ends) finds its slots idle, and a burst that came in the last seconds
# may come again.
RESERVE_WINDOW_S = 10.0
# How long a batch line waits in the engine's queue for a slot before it is sent back to its runner.
BATCH_WAIT_S = 1.0


class InteractiveDemand:
    """The most slots interactive requests held or waited for at once in the last `window_s` seconds."""

    def __init__(self, window_s: float = RESERVE_WINDOW_S) -> None:
        self.window_s = window_s
        self.peak = 0
        self.at = float("-inf")

    def update(self, demand: int, now: float) -> int:
        if demand >= self.peak or now - self.at > self.window_s:
            self.peak, self.at = demand, now
        return self.peak


@dataclass(frozen=True)
class BatchShare:
    """What batch work may take now, given the slots: `admit` batch lines up to that many idle slots; `preempt`
    running batch lines (their slots go to interactive requests that wait)."""

    admit: int
    preempt: int


def batch_share(slots: int, idle: int, running_batch: int, interactive_waiting: int, reserve: int) -> BatchShare:
    """`interactive_waiting`: slots interactive requests still wait for after their admission this turn;
    `reserve`: interactive demand's recent peak (InteractiveDemand), of which at most all slots but one are kept
    from batch work (a model alone with a batch runs it; nothing waits on an idle engine)."""
    if interactive_waiting:
        return BatchShare(0, min(running_batch, max(0, interactive_waiting - idle)))
    allowance = slots - min(reserve, slots - 1) - running_batch
    return BatchShare(max(0, min(idle, allowance)), 0)


def interactive_first(waiting: Sequence[Q]) -> tuple[list[Q], list[Q]]:
    """`waiting` split, each part in its order: interactive requests, then batch lines."""
    interactive, batch = [], []
    for g in waiting:
        (batch if g.req.batch else interactive).append(g)
    return interactive, batch
