"""How generate_stream groups an engine's steps into chunks (app/engine/stream.py), against a paced fake
engine: the first text at once, then chunks that leave on a step's end while the next step would
overshoot the window, never waiting past it for a slow step. The real engine's streams are tested in
test_engine.py; this is only the timing policy, which the real model cannot pace exactly."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from app.engine.events import Finished, Started, Text
from app.engine.stream import MAX_WINDOW_S, StepEvents, coalescing_window, generate_stream

pytestmark = pytest.mark.timeout(60)


class PacedEngine:
    """One token per step; `step_times[i]` is how long step i takes. Events reach the sink as the
    engine thread publishes them: a step's events at once, at its end."""

    def __init__(self, step_times: list[float], active: int = 16, step_s: float | None = None) -> None:
        self.step_times = step_times
        self.active = active
        self.step_s = step_times[0] if step_s is None else step_s
        self.cancelled: list[str] = []
        self.step_ends: list[float] = []

    def prepare(self, req, sink):
        return sink

    def submit(self, sink) -> None:
        asyncio.get_running_loop().create_task(self._run(sink))

    async def _run(self, sink) -> None:
        sink(Started(prompt_tokens=3, cached_tokens=0))
        n = len(self.step_times)
        for i, dt in enumerate(self.step_times):
            await asyncio.sleep(dt)
            self.step_ends.append(asyncio.get_running_loop().time())
            sink(Text("x", 1))
            if i == n - 1:
                sink(Finished("length", 3, n, 0))

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


async def chunks_of(engine: PacedEngine, interval_s: float) -> list[tuple[float, int, bool]]:
    """(arrival time, tokens, finished) of every chunk with text."""
    loop = asyncio.get_running_loop()
    req = SimpleNamespace(request_id="r1", n=1, tenant="", batch=False)
    out = []
    async for batch in generate_stream(engine, req, interval_s):
        tokens = sum(ev.tokens for ev in batch if isinstance(ev, Text))
        if tokens:
            out.append((loop.time(), tokens, any(isinstance(ev, Finished) for ev in batch)))
    return out


def test_window_grows_with_streams_up_to_the_cap():
    assert coalescing_window(0.025, 1) == 0.025
    assert coalescing_window(0.025, 4) == pytest.approx(0.06)
    assert coalescing_window(0.025, 64) == MAX_WINDOW_S


def test_first_text_alone_then_steps_grouped_within_the_window():
    step = 0.03
    engine = PacedEngine([step] * 40)
    chunks = asyncio.run(chunks_of(engine, 0.025))
    assert sum(t for _, t, _ in chunks) == 40 and chunks[-1][2]
    assert chunks[0][1] == 1  # time to first token: not held
    middle = chunks[1:-1]
    # 16 streams: the window is the cap; it holds cap // step steps (the next would end after it).
    held = int(MAX_WINDOW_S // step)
    assert middle and all(2 <= t <= held + 1 for _, t, _ in middle), [t for _, t, _ in chunks]
    assert sum(t for _, t, _ in middle) / len(middle) >= held - 1.5
    gaps = [b[0] - a[0] for a, b in zip(chunks, chunks[1:])]
    assert max(gaps) <= MAX_WINDOW_S + 0.1, gaps
    # Each chunk left as a step ended, not later (waiting between steps adds latency, no tokens).
    lags = [min(t - end for end in engine.step_ends if end <= t) for t, _, _ in chunks]
    assert max(lags) < step / 2, lags


def test_one_chunk_per_step_without_a_window():
    chunks = asyncio.run(chunks_of(PacedEngine([0.01] * 12), 0))
    assert [t for _, t, _ in chunks] == [1] * 12


def test_a_slow_step_is_not_waited_for_past_the_window():
    # Steps of 30 ms, then one of 1 s (another sequence's long prompt in the batch): the tokens held
    # before it go out at the window's end instead of waiting for it.
    times = [0.03] * 6 + [1.0] + [0.03] * 3
    chunks = asyncio.run(chunks_of(PacedEngine(times, step_s=0.03), 0.025))
    assert sum(t for _, t, _ in chunks) == len(times)
    gaps = [b[0] - a[0] for a, b in zip(chunks, chunks[1:])]
    # One gap holds the slow step itself (no tokens exist then); before it, nothing waited for it.
    assert sorted(gaps)[-2] <= MAX_WINDOW_S + 0.1, gaps
    assert max(gaps) < 1.0 + 0.1


def test_a_finished_stream_is_not_held():
    chunks = asyncio.run(chunks_of(PacedEngine([0.01, 0.01, 0.5]), 0.025))
    # The last step (0.5 s) ends the stream: its chunk leaves on arrival, carrying Finished.
    assert chunks[-1][2]
    assert sum(t for _, t, _ in chunks) == 3


async def _settled(task: asyncio.Task, turns: int = 5) -> bool:
    """Whether `task` finished after the loop ran a few times (a wake-up it was given would have run)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return task.done()


def test_a_held_stream_is_not_woken_by_each_step():
    # The stream holds its chunk for 10 s and a step takes 1 s: the steps' events gather without waking
    # it (one task wake-up per chunk, not per token); an event that ends a choice wakes it at once.
    async def scenario():
        loop = asyncio.get_running_loop()
        inbox = StepEvents(loop)
        task = asyncio.create_task(inbox.take(loop.time() + 10.0, step_s=1.0))
        assert not await _settled(task)
        for _ in range(3):
            inbox.put_nowait(Text("x", 1))
            assert not await _settled(task)
        inbox.put_nowait(Finished("stop", 3, 3, 0))
        assert await _settled(task)
        return task.result()

    events = asyncio.run(scenario())
    assert [type(ev).__name__ for ev in events] == ["Text"] * 3 + ["Finished"]


def test_the_step_after_which_the_next_would_end_late_wakes_the_stream():
    async def scenario():
        loop = asyncio.get_running_loop()
        inbox = StepEvents(loop)
        task = asyncio.create_task(inbox.take(loop.time() + 0.5, step_s=1.0))
        assert not await _settled(task)
        inbox.put_nowait(Text("x", 1))  # the next step would end past the window: this one goes
        assert await _settled(task)
        # Events already there when the stream asks again, the window not yet over but no room for a step.
        inbox.put_nowait(Text("y", 1))
        return task.result(), await inbox.take(loop.time() + 0.5, step_s=1.0)

    first, second = asyncio.run(scenario())
    assert [ev.text for ev in first] == ["x"] and [ev.text for ev in second] == ["y"]


def test_a_late_step_is_not_waited_for_past_the_window_nor_an_empty_window_left_early():
    async def scenario():
        loop = asyncio.get_running_loop()
        inbox = StepEvents(loop)
        until = loop.time() + 1.0
        task = asyncio.create_task(inbox.take(until, step_s=0.01))
        inbox.put_nowait(Text("x", 1))  # steps of 10 ms would fit: held...
        assert not await _settled(task)
        events = await asyncio.wait_for(task, 5)  # ...until the window's end, the next step late
        left = loop.time()
        # A window that ends with nothing held: the stream waits for the next event, then goes at once.
        task = asyncio.create_task(inbox.take(loop.time() + 0.05, step_s=0.01))
        await asyncio.sleep(0.15)
        assert not task.done()
        inbox.put_nowait(Text("y", 1))
        assert await _settled(task)
        return events, left - until

    events, late_by = asyncio.run(scenario())
    assert [ev.text for ev in events] == ["x"]
    assert 0 <= late_by < 1.0
