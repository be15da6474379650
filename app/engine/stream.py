"""The bridge from the engine thread to asyncio, coalescing pieces so Ray hops stay cheap.

`publish_to_loops` is the engine's publisher: a step's events for one event loop go over in a single
`call_soon_threadsafe` (one wake-up per step, not per token); other sinks are called directly.

`generate_stream` prepares the request off the event loop, then yields lists of events (events.py). The first text piece goes out at once (time to
first token); after that, pieces are held while the next engine step would still end within the
coalescing window, then go together. Tokens arrive once per step, so a chunk leaves on a step's end,
never between two: waiting past one would only add latency. The window grows with the number of
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

from .events import Event, Failed, Finished, Text, coalesce
from .params import GenerationRequest
from .protocol import GenerationEngine
from .slots import Generation, Sink

PER_STREAM_S = 0.015
# A chunk never waits longer than this after the one before it, plus its delivery through Ray and HTTP
# (up to ~80 ms at p99 measured on 2 busy cores): under the 250 ms a client may wait between two chunks.
# With 16 sequences on 2 cores (a step ~70-85 ms) a chunk carries two steps' tokens, half the Ray items
# of one a step (docs/benchmarks.md).
MAX_WINDOW_S = 0.17


class QueueSink:
    """A generation's events into an asyncio queue on `loop`."""

    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        self.loop = loop
        self.queue = queue

    def __call__(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def _deliver(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


def publish_to_loops(items: list[tuple[Sink, Event]]) -> None:
    """The engine's publisher for asyncio consumers (called on the engine thread)."""
    by_loop: dict[Any, list[tuple[asyncio.Queue, Event]]] = {}
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


def _drain(queue: asyncio.Queue[Event], events: list[Event]) -> None:
    while not queue.empty():
        events.append(queue.get_nowait())


def _ends_choice(events: list[Event]) -> bool:
    return any(isinstance(ev, (Finished, Failed)) for ev in events)


async def _hold_for_steps(queue: asyncio.Queue[Event], events: list[Event], deadline: float, step_s: float) -> None:
    """Adds the events of further engine steps to `events` while the next step should end before
    `deadline` (loop time); a slower step than `step_s` is not waited for past the deadline. A
    finished or failed choice goes out at once."""
    loop = asyncio.get_running_loop()
    while not _ends_choice(events) and loop.time() + step_s <= deadline:
        try:
            async with asyncio.timeout_at(deadline):
                events.append(await queue.get())
        except TimeoutError:
            return
        _drain(queue, events)


class _Handoff:
    """A prepared generation passes from the preparing thread to its stream, or, when the stream gave up
    meanwhile, is discarded (its samplers freed): exactly one of the two, whichever side comes last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gen: Generation | None = None
        self.abandoned = False


async def _prepare(engine: GenerationEngine, req: GenerationRequest, sink: Sink) -> Generation:
    """engine.prepare (tokenizing a long prompt, parsing a grammar: CPU work) in a thread, never on the
    event loop; an engine error for bad input."""
    handoff = _Handoff()

    def work() -> None:
        gen = engine.prepare(req, sink)
        with handoff.lock:
            if not handoff.abandoned:
                handoff.gen = gen
                return
        engine.discard(gen)

    try:
        await asyncio.to_thread(work)
    except asyncio.CancelledError:  # the thread goes on; what it prepares is not wanted
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
    queue: asyncio.Queue[Event] = asyncio.Queue()
    gen = await _prepare(engine, req, QueueSink(loop, queue))
    engine.submit(gen)
    finished = sent_text = False
    done = 0  # choices finished
    last_yield = 0.0
    try:
        while not finished:
            events = [await queue.get()]
            _drain(queue, events)  # a step's events arrive together
            if sent_text and interval_s > 0:
                window = coalescing_window(interval_s, engine.active)
                await _hold_for_steps(queue, events, last_yield + window, engine.step_s)
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
