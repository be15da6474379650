"""A pool replica's models: up to `max_models` engines (and within a memory budget) loaded on a model's first
request, the idle one least in demand evicted to make room (its requests here, halved every DEMAND_HALF_LIFE_S;
the least recently used among equals), idle ones unloaded after `idle_unload_s`.

Everything here runs on the replica's event loop (no lock: each decision is made between two awaits); the
load itself is the `load` coroutine's, which runs llama.cpp off the loop. Concurrent requests for a cold model
share one load. A model is never evicted while pinned, loading, or while a request uses it (`active`): a
request holds its model for its whole stream, so a generation never loses its engine. A request for a cold model
that finds every model busy waits (up to the plan's `room_wait_s`) for one to go idle, rather than a 503 at once:
the client would only send it again later, after a Retry-After of whole seconds, and lose its turn meanwhile.
A request that has waited the plan's `claim_after_s` claims the held model it will replace (the one with the
fewest requests on it): requests that come for that model after it wait with it instead of keeping the model
busy, so a cold request waits for the requests ahead of it, not for a stream of later ones. (Not at once: most
waits end within one request, and a claim makes the claimed model's next request a cold one too: more loads, a
higher median.)

An operator may also load, pin, unpin and unload a model (the admin routes, app/pools/admin.py): `pins` starts as
the plan's `pinned` and changes with them; an unload waits for the model's requests to end, within a bound."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ..api.errors import APIError, model_busy, model_not_found, overloaded, service_unavailable
from .plan import PoolPlan, mib

log = logging.getLogger("llamaray.pool")

Host = TypeVar("Host")
PoolState = Literal["loaded", "loading", "available"]
# What a pool reports happening to a model: ("loaded", seconds), ("load_failed", why), ("evicted", lru|idle).
Event = Literal["loaded", "load_failed", "evicted", "room_waited", "claimed"]

# The keys of a pool replica's routing stats: how many models could begin loading there now (room_now), how many of
# those without evicting one (free_now), and where none could, how many requests the soonest room waits for
# (ahead_now).
POOL_ROOM = "pool_room"
POOL_FREE = "pool_free"
POOL_AHEAD = "pool_ahead"
FULL_RETRY_AFTER_S = 2
UNLOAD_WAIT_S = 10.0  # how long an unload waits for the model's requests (and a load under way) to end
# A pool's traffic is skewed (a few models get most requests): evicting by recency alone lets a burst of rare
# models push out a popular one between two of its requests, and each such eviction is a cold load later. A
# model's requests here, halved every minute, keep the popular ones; a model that stops being asked for loses
# its claim within minutes. Measured against LRU with bench.pool's Zipf workload: docs/benchmarks.md.
DEMAND_HALF_LIFE_S = 60.0


@dataclass
class _Entry(Generic[Host]):
    host: Host | None = None
    loading: asyncio.Task | None = None
    active: int = 0
    last_used: float = 0.0


class PoolManager(Generic[Host]):
    """`load(model_id)` makes a model's host (an engine ready to serve) or raises why it cannot; `unload(host)`
    frees one; `on_event(event, model_id, detail)` hears of loads, failures and evictions (metrics, routing)."""

    def __init__(self, plan: PoolPlan, load: Callable[[str], Awaitable[Host]],
                 unload: Callable[[Host], Awaitable[None]], *,
                 on_event: Callable[[Event, str, Any], None] = lambda *_: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.plan = plan
        self._load = load
        self._unload = unload
        self._on_event = on_event
        self._clock = clock
        self.entries: dict[str, _Entry[Host]] = {}
        self._closing: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None
        self.pins: set[str] = set(plan.pinned)  # never evicted (LRU or idle): the plan's, then the operator's
        # model id -> (when its load failed, the 503 it failed with): a corrupt file is not read again by
        # every request, only once failed_load_retry_s has passed.
        self._failed: dict[str, tuple[float, APIError]] = {}
        self._room = asyncio.Event()  # set (and replaced) when room may have come: _room_changed
        # Models that requests waiting for room will replace: new requests for them wait instead of joining.
        self._claimed: set[str] = set()
        # model id -> (its requests here, decayed; when last counted): kept across evictions, so a popular model
        # loaded again is not the first to go.
        self._demand: dict[str, tuple[float, float]] = {}

    # ---- what it holds ---------------------------------------------------------------------------------

    def state(self, model_id: str) -> PoolState:
        entry = self.entries.get(model_id)
        if entry is None:
            return "available"
        return "loaded" if entry.host is not None else "loading"

    def states(self) -> dict[str, PoolState]:
        return {m: self.state(m) for m in self.plan.models}

    def loaded(self) -> dict[str, Host]:
        return {m: e.host for m, e in self.entries.items() if e.host is not None}

    def used_bytes(self) -> int:
        return sum(self.plan.needs.get(m, 0) for m in self.entries)

    def describe(self) -> dict[str, dict[str, Any]]:
        """What this replica holds, for the admin routes: each model held (loaded or loading), with its pin and its
        requests in flight."""
        return {m: {"state": self.state(m), "pinned": m in self.pins, "active": e.active}
                for m, e in self.entries.items()}

    def room_now(self) -> int:
        """Models a request could begin loading here now, without waiting for room: free places under max_models
        and idle models it may evict (the pool router sends a model no replica holds to a replica with room,
        deployments/prefix_router.py). A hint: the memory budget may still make a load evict two."""
        return self.free_now() + len(self._idle())

    def free_now(self) -> int:
        """Free places under max_models: a model loaded there evicts none (a hint, as room_now)."""
        return max(0, self.plan.max_models - len(self.entries))

    def ahead_now(self) -> int | None:
        """Where there is no room: the fewest requests on a model that could make room once they end (loaded, not
        pinned, not claimed already), what a cold request would wait for here; None where no model could (every one
        pinned, loading or claimed). The pool router sends a cold model to the replica with the fewest."""
        claimable = self._claimable()
        return min(claimable)[0] if claimable else None

    def adopt(self, model_id: str, host: Host) -> None:
        """A model loaded before the loop serves (a pinned model, at the replica's start)."""
        self.entries[model_id] = _Entry(host=host, last_used=self._clock())
        self._on_event("loaded", model_id, 0.0)

    # ---- using a model -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def use(self, model_id: str, *, evict: bool = True) -> AsyncIterator[Host]:
        """The model's host, loaded first when it is not; held (never evicted) until the block ends. `evict`
        False (batch work): a model that would need another unloaded to fit is not loaded (a 503
        `pool_busy_for_batch` the batch runner retries later): batch lines load a model only into room."""
        if model_id not in self.plan.needs:
            raise model_not_found(model_id)
        self._start_reaper()
        if evict:  # a batch job's lines are not demand: they only take room that interactive traffic leaves
            self._count_demand(model_id)
        entry = self._joinable(model_id) or await self._room_for(model_id, evict)
        entry.active += 1
        entry.last_used = self._clock()
        try:
            if entry.host is None:
                assert entry.loading is not None
                # Shielded: a waiter that leaves (a client gone) does not cancel the load the others wait on.
                await asyncio.shield(entry.loading)
            assert entry.host is not None
            yield entry.host
        finally:
            entry.active -= 1
            entry.last_used = self._clock()
            if entry.active == 0:
                self._room_changed()

    async def _room_for(self, model_id: str, evict: bool) -> _Entry[Host]:
        """`model_id`'s entry, its load begun: at once where there is room (or a model to evict), else once a model
        goes idle, within the plan's room_wait_s (then the 503 of a full pool). Batch work (`evict` False) waits
        for nothing: its runner sends the line again later."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + self.plan.room_wait_s
        waited = False
        claim: str | None = None
        try:
            while True:
                entry = self._joinable(model_id)
                if entry is not None:
                    return entry
                if model_id in self.entries:  # claimed: it goes once its requests end, then loads again
                    error = self._busy_for_batch(model_id) if not evict else overloaded(
                        f"model {model_id!r} is being unloaded in pool {self.plan.name!r} to make room for a "
                        "request that came before; retry shortly", retry_after_s=FULL_RETRY_AFTER_S)
                else:
                    try:
                        return self._begin_load(model_id, evict)
                    except _PoolFull as full:
                        error = full.error
                        # None yet, or it went (evicted for another request)
                        if claim not in self._claimed and loop.time() >= began + self.plan.claim_after_s:
                            claim = self._claim()
                left = deadline - loop.time()
                if not evict or left <= 0:
                    raise error from None
                waited = True
                changed = self._room
                until_claim = began + self.plan.claim_after_s - loop.time()
                try:
                    await asyncio.wait_for(changed.wait(), min(left, until_claim) if until_claim > 0 else left)
                except asyncio.TimeoutError:
                    if loop.time() >= deadline:
                        raise error from None
        finally:
            if claim in self._claimed:  # its requests may come in again
                self._claimed.discard(claim)
                self._room_changed()
            if waited:  # what a cold request spends before its load, apart from the load (metrics, bench.pool)
                self._on_event("room_waited", model_id, loop.time() - began)

    def _joinable(self, model_id: str) -> _Entry[Host] | None:
        """The model's entry, unless a request waiting for room claimed it (new requests do not keep it busy)."""
        return None if model_id in self._claimed else self.entries.get(model_id)

    def _claim(self) -> str | None:
        """The model a request waiting for room claims: loaded, not pinned, not claimed by another waiter, with the
        fewest requests on it (the least recently used among those), so that it goes idle soonest; None if none."""
        claimable = self._claimable()
        if not claimable:
            return None
        model_id = min(claimable)[2]
        self._claimed.add(model_id)
        self._on_event("claimed", model_id, None)
        return model_id

    def _claimable(self) -> list[tuple[int, float, str]]:
        """(requests on it, last used, model) of each model a waiting request may claim: loaded, not pinned, not
        claimed already."""
        return [(e.active, e.last_used, m) for m, e in self.entries.items()
                if e.host is not None and m not in self.pins and m not in self._claimed]

    def _room_changed(self) -> None:
        """A model went idle or away, or a load ended: the requests waiting for room look again."""
        self._room.set()
        self._room = asyncio.Event()

    def _begin_load(self, model_id: str, evict: bool = True) -> _Entry[Host]:
        """Make room and start loading `model_id` (no await between the checks and the entry's insertion); _PoolFull
        when every model held is busy, pinned or loading."""
        self._refuse_failed(model_id)
        need, budget = self.plan.needs.get(model_id, 0), self.plan.budget_bytes
        if budget is not None and need > budget:
            raise service_unavailable(
                f"model {model_id!r} needs {mib(need)} (its GGUF plus its KV cache), more than pool "
                f"{self.plan.name!r}'s memory budget of {mib(budget)} (memory_budget_mib)", code="model_too_large")
        while len(self.entries) >= self.plan.max_models or (budget is not None and self.used_bytes() + need > budget):
            if not evict:
                raise self._busy_for_batch(model_id)
            victim = self._to_evict()
            if victim is None:
                busy = ", ".join(sorted(self.entries))
                why = (f"{self.plan.max_models} models (max_models)" if len(self.entries) >= self.plan.max_models
                       else f"{mib(self.used_bytes())} of its {mib(budget or 0)} memory budget")
                raise _PoolFull(overloaded(
                    f"pool {self.plan.name!r} cannot load model {model_id!r} now: it holds {why}, all busy, pinned "
                    f"or loading ({busy}); retry shortly", retry_after_s=FULL_RETRY_AFTER_S))
            self._evict(victim, "lru")
        entry: _Entry[Host] = _Entry(last_used=self._clock())
        entry.loading = asyncio.ensure_future(self._loaded(model_id, entry))
        entry.loading.add_done_callback(_retrieved)
        self.entries[model_id] = entry
        return entry

    async def _loaded(self, model_id: str, entry: _Entry[Host]) -> Host:
        # Memory of the models just evicted is freed before this one takes its own.
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        started = self._clock()
        try:
            host = await self._load(model_id)
        except BaseException as exc:
            if self.entries.get(model_id) is entry:
                del self.entries[model_id]
            self._room_changed()
            why = exc.message if isinstance(exc, APIError) else (str(exc) or type(exc).__name__)
            self._on_event("load_failed", model_id, why)
            log.error("pool %r: model %r failed to load: %s", self.plan.name, model_id, why)
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = service_unavailable(f"model {model_id!r} could not be loaded (pool {self.plan.name!r}): {why}",
                                        code="model_load_failed")
            retry = self.plan.failed_load_retry_s
            if retry <= 0:
                raise error from None
            self._failed[model_id] = (self._clock(), error)
            raise APIError(f"{error.message} (this replica tries to load it again in {math.ceil(retry)} s)",
                           status=503, type=error.type, code=error.code, logged=True,
                           headers={"Retry-After": str(math.ceil(retry))}) from None
        self._failed.pop(model_id, None)
        entry.host, entry.loading = host, None
        self._room_changed()
        self._on_event("loaded", model_id, self._clock() - started)
        return host

    # ---- what an operator asks ----------------------------------------------------------------------------

    async def load(self, model_id: str, *, pin: bool = False) -> None:
        """Load the model now (nothing to do when it is loaded: the same as a request's load); `pin`: keep it."""
        async with self.use(model_id):
            if pin:
                self.pins.add(model_id)

    def set_pinned(self, model_id: str, pinned: bool) -> None:
        """Pin a model this replica holds (or unpin it: evictable again). A model it does not hold is not pinned
        here (pinning means keeping what is loaded; the admin service loads it first where it is nowhere)."""
        if model_id not in self.plan.needs:
            raise model_not_found(model_id)
        if not pinned:
            self.pins.discard(model_id)
            self._room_changed()
        elif model_id in self.entries:
            self.pins.add(model_id)

    async def unload(self, model_id: str, wait_s: float = UNLOAD_WAIT_S) -> None:
        """Unload the model (unpinning it), once no request uses it and its load, if under way, ended; waiting
        `wait_s` at most for that, else 409 `model_busy` (nothing changed). A model not held: nothing to do."""
        if model_id not in self.plan.needs:
            raise model_not_found(model_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (entry := self.entries.get(model_id)) is not None:
            if entry.host is not None and entry.active == 0:
                self.pins.discard(model_id)
                await self._evict(model_id, "admin")  # answered once its memory is freed
                break
            left = deadline - loop.time()
            if left <= 0:
                why = "loading" if entry.host is None else f"serving {entry.active} request(s)"
                raise model_busy(f"model {model_id!r} is {why} in pool {self.plan.name!r} and did not finish within "
                                 f"{wait_s:g} s; it stays loaded: retry the unload", retry_after_s=FULL_RETRY_AFTER_S)
            if entry.loading is not None:
                await asyncio.wait([entry.loading], timeout=left)  # not cancelled: the requests waiting keep it
            else:
                await asyncio.sleep(min(0.05, left))
        self.pins.discard(model_id)

    def _busy_for_batch(self, model_id: str) -> APIError:
        return APIError(f"pool {self.plan.name!r} has no room for model {model_id!r} without unloading another: "
                        "batch work waits for room", status=503, type="server_error", code="pool_busy_for_batch",
                        headers={"Retry-After": str(FULL_RETRY_AFTER_S)})

    def _refuse_failed(self, model_id: str) -> None:
        """The 503 of a load that failed less than failed_load_retry_s ago, saying when it is tried again."""
        failed = self._failed.get(model_id)
        if failed is None:
            return
        at, error = failed
        wait = at + self.plan.failed_load_retry_s - self._clock()
        if wait <= 0:
            del self._failed[model_id]
            return
        raise APIError(f"{error.message} (failed {self._clock() - at:.0f} s ago; this replica tries to load it "
                       f"again in {math.ceil(wait)} s)", status=error.status, type=error.type, code=error.code,
                       headers={"Retry-After": str(math.ceil(wait))}, logged=True)

    def _idle(self) -> list[tuple[float, str]]:
        """(last used, model) of each model that may go: loaded, not pinned, no request on it."""
        return [(e.last_used, m) for m, e in self.entries.items()
                if e.host is not None and e.active == 0 and m not in self.pins]

    def _to_evict(self) -> str | None:
        """The model that may go: one a waiting request claimed first, else the one least in demand, else the least
        recently used."""
        idle = [(m not in self._claimed, self.demand(m), last_used, m) for last_used, m in self._idle()]
        return min(idle)[3] if idle else None

    def _count_demand(self, model_id: str) -> None:
        self._demand[model_id] = (self.demand(model_id) + 1.0, self._clock())

    def demand(self, model_id: str) -> float:
        """The model's requests on this replica, each counting half as much every DEMAND_HALF_LIFE_S."""
        count, at = self._demand.get(model_id, (0.0, 0.0))
        return count * 0.5 ** (max(0.0, self._clock() - at) / DEMAND_HALF_LIFE_S) if count else 0.0

    def _evict(self, model_id: str, reason: str) -> asyncio.Task:
        entry = self.entries.pop(model_id)
        self._claimed.discard(model_id)
        self._room_changed()
        log.info("pool %r: unloading model %r (%s)", self.plan.name, model_id, reason)
        task = asyncio.ensure_future(self._unload(entry.host))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(_retrieved)
        self._on_event("evicted", model_id, reason)
        return task

    # ---- idle unloading ----------------------------------------------------------------------------------

    def reap_idle(self) -> list[str]:
        """Unload every model idle for idle_unload_s or longer (not pinned, no request on it)."""
        if self.plan.idle_unload_s <= 0:
            return []
        now = self._clock()
        gone = [m for last_used, m in self._idle() if now - last_used >= self.plan.idle_unload_s]
        for model_id in gone:
            self._evict(model_id, "idle")
        return gone

    def _start_reaper(self) -> None:
        if self._reaper is None and self.plan.idle_unload_s > 0:
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def _reap_forever(self) -> None:
        interval = min(5.0, max(0.1, self.plan.idle_unload_s / 4))
        while True:
            await asyncio.sleep(interval)
            self.reap_idle()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for model_id in [m for m, e in self.entries.items() if e.host is not None]:
            self._evict(model_id, "shutdown")
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


class _PoolFull(Exception):
    """No room for a model now: every model held is busy, pinned or loading (`error`: the 503 if it stays so)."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def _retrieved(task: asyncio.Task) -> None:
    """Mark a background task's exception seen (its waiters, if any, got it)."""
    if not task.cancelled():
        task.exception()
