"""The bridge from the engine thread to asyncio, coalescing pieces so Ray hops stay cheap.

`publish_to_loops` is the engine's publisher: a step's events for one event loop go over in a single
`call_soon_threadsafe` (one wake-up per step, not per token); other sinks are called directly.

`generate_stream` prepares the request off the event loop, then yields lists of events (events.py). The first text piece goes out at once (time to
first token); after that, pieces are held while the next engine step would still end within the
coalescing window, then go together. Tokens arrive once per step, so a chunk leaves on a step's end,
never between two: waiting past one would only add latency. While a stream holds its chunk, its task
sleeps (`StepEvents`): it is woken once per chunk, not by every step. The window grows with the number of
sequences the engine is decoding (`PER_STREAM_S` each): every item costs CPU at each Ray hop, and on a
small machine that CPU is taken from llama.cpp's threads, so the replica's total item rate stays
roughly constant however many streams it serves, up to a window of MAX_WINDOW_S. A `Failed` event
is raised as its engine error. Closing the generator early cancels the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from ..tenants.prep_pool import PREPARATION
from .events import Event, Failed, Finished, Text, coalesce
from .params import GenerationRequest
from .protocol import GenerationEngine
from .slots import Generation, Sink

PER_STREAM_S = 0.015
# A chunk never waits longer than this after the one before it, plus its delivery through Ray and HTTP
# (up to ~80 ms at p99 measured on 2 busy cores): under the 250 ms a client may wait between two chunks.
# With 16 sequences on 2 cores (a step ~70-85 ms) a chunk carries two steps' tokens, half the Ray items
# of one a step (docs/history/benchmarks-2026.md).
MAX_WINDOW_S = 0.17


class StepEvents:
    """One generation's events as the engine's steps deliver them (on its event loop), and the single wake-up
    its stream waits for.

    A stream holding a chunk for its coalescing window is not woken by every step: only by the step after
    which the next would end past the window, by an event that ends a choice, or by the window's end when a
    step is late. At 64 streams of a fast engine that is one task wake-up per chunk instead of one per token
    per stream (docs/history/benchmarks-2026.md, the graph at GPU speed)."""

    __slots__ = ("loop", "events", "_waiter", "_until", "_step_s")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: list[Event] = []
        self._waiter: asyncio.Future[None] | None = None
        self._until: float | None = None   # loop time the held events must leave by; None: at once
        self._step_s = 0.0

    def _due(self, ends_choice: bool) -> bool:
        """Whether the events held now should go: no window, a choice ended, or no room for another step."""
        return self._until is None or ends_choice or self.loop.time() + self._step_s > self._until

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def put_nowait(self, event: Event) -> None:
        self.events.append(event)
        if self._waiter is not None and self._due(isinstance(event, (Finished, Failed))):
            self._wake()

    def _window_over(self) -> None:
        self._until = float("-inf")  # whatever is here goes now, and whatever comes next at once
        if self.events:
            self._wake()

    async def take(self, until: float | None = None, step_s: float = 0.0) -> list[Event]:
        """The events delivered so far, once there are some. With `until` (loop time) they are held while
        the next step of `step_s` should end before it, unless one of them ends a choice; a step later than
        that is not waited for past `until`."""
        self._until, self._step_s = until, step_s
        if self.events and self._due(_ends_choice(self.events)):
            return self._take()
        timer = self.loop.call_at(until, self._window_over) if until is not None else None
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return self._take()

    def _take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


class QueueSink:
    """A generation's events into its `StepEvents` on `loop`."""

    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: StepEvents) -> None:
        self.loop = loop
        self.queue = queue

    def __call__(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def _deliver(items: list[tuple[StepEvents, Event]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


def publish_to_loops(items: list[tuple[Sink, Event]]) -> None:
    """The engine's publisher for asyncio consumers (called on the engine thread)."""
    by_loop: dict[Any, list[tuple[StepEvents, Event]]] = {}
    for sink, event in items:
        if isinstance(sink, QueueSink):
            by_loop.setdefault(sink.loop, []).append((sink.queue, event))
        else:
            sink(event)
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # that event loop is closed: nobody is listening
            pass


def coalescing_window(base_s: float, active: int) -> float:
    return min(MAX_WINDOW_S, max(base_s, active * PER_STREAM_S))


def _ends_choice(events: list[Event]) -> bool:
    return any(isinstance(ev, (Finished, Failed)) for ev in events)


class _Handoff:
    """A prepared generation passes from the preparing thread to its stream, or, when the stream gave up
    meanwhile, is discarded (its samplers freed): exactly one of the two, whichever side comes last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gen: Generation | None = None
        self.abandoned = False


async def _prepare(engine: GenerationEngine, req: GenerationRequest, sink: Sink) -> Generation:
    """engine.prepare (tokenizing a long prompt, parsing a grammar: CPU work) on the preparation pool in the
    request's key's turn (app/tenants/prep_pool.py), never on the event loop; an engine error for bad input."""
    handoff = _Handoff()

    def work() -> None:
        gen = engine.prepare(req, sink)
        with handoff.lock:
            if not handoff.abandoned:
                handoff.gen = gen
                return
        engine.discard(gen)

    try:
        await PREPARATION.run(req.tenant, work, low=req.batch)
    except asyncio.CancelledError:  # a started job goes on; what it prepares is not wanted
        with handoff.lock:
            handoff.abandoned = True
            gen, handoff.gen = handoff.gen, None
        if gen is not None:
            engine.discard(gen)
        raise
    assert handoff.gen is not None
    return handoff.gen


async def generate_stream(engine: GenerationEngine, req: GenerationRequest, interval_s: float) -> AsyncIterator[list[Event]]:
    loop = asyncio.get_running_loop()
    inbox = StepEvents(loop)
    gen = await _prepare(engine, req, QueueSink(loop, inbox))
    engine.submit(gen)
    finished = sent_text = False
    done = 0  # choices finished
    last_yield = 0.0
    try:
        while not finished:
            if sent_text and interval_s > 0:
                events = await inbox.take(last_yield + coalescing_window(interval_s, engine.active), engine.step_s)
            else:
                events = await inbox.take()  # a step's events arrive together
            failed = next((ev for ev in events if isinstance(ev, Failed)), None)
            if failed is not None:
                finished = True
                before = coalesce(events[:events.index(failed)])
                if before:
                    yield before
                raise failed.error
            done += sum(isinstance(ev, Finished) for ev in events)
            finished = done >= req.n
            sent_text = sent_text or any(isinstance(ev, Text) for ev in events)
            last_yield = loop.time()
            yield coalesce(events)
    finally:
        if not finished:
            # Client gone or the caller stopped reading: free the slot on the next step.
            engine.cancel(req.request_id)
