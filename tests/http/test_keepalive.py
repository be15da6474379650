"""Keep-alive ticks on an idle stream: `: keep-alive` comments while nothing flows, none between fast
chunks, the pending pull never cancelled by a tick, and closing the stream closing its source."""

from __future__ import annotations

import asyncio
import time

from app.http.keepalive import TICK, with_ticks
from app.http.sse import KEEPALIVE, frame_stream

INTERVAL = 0.05


async def slow_source(plan: list[tuple[float, object]], log: list[str]):
    """Yields each item after its delay; records how it ended."""
    try:
        for delay, item in plan:
            await asyncio.sleep(delay)
            log.append(f"yield {item}")
            yield item
        log.append("done")
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    finally:
        log.append("closed")


def run_ticks(plan, interval=INTERVAL, **kw) -> tuple[list, list[str]]:
    log: list[str] = []

    async def go():
        return [item async for item in with_ticks(slow_source(plan, log), interval, **kw)]
    return asyncio.run(go()), log


def test_ticks_while_the_source_is_silent():
    items, log = run_ticks([(0.0, "a"), (INTERVAL * 5.5, "b"), (0.0, "c")])
    assert items[0] == "a" and items[-2:] == ["b", "c"]
    ticks = items[1:-2]
    assert ticks and all(t is TICK for t in ticks)
    assert 3 <= len(ticks) <= 6, items  # one per interval of the 5.5-interval silence (timers are loose)
    # the slow item was awaited through the ticks, not cancelled and pulled again
    assert log == ["yield a", "yield b", "yield c", "done", "closed"]


def test_no_ticks_between_fast_chunks():
    items, _ = run_ticks([(INTERVAL / 10, i) for i in range(20)])
    assert items == list(range(20))


def test_pulls_at_most_one_item_ahead_of_the_reader():
    """Back-pressure: a reader that stops taking (a slow client) stops the pulls from the generation."""
    async def go():
        log: list[str] = []
        ticks = with_ticks(slow_source([(0, i) for i in range(10)], log), INTERVAL)
        assert await anext(ticks) == 0
        deadline = time.monotonic() + 5
        while "yield 1" not in log and time.monotonic() < deadline:  # the relay pulls the next one meanwhile
            await asyncio.sleep(0.001)
        for _ in range(50):  # every item of the source is ready: a relay without a bound would pull them all now
            await asyncio.sleep(0)
        pulled = [e for e in log if e.startswith("yield")]
        await ticks.aclose()
        return pulled, log
    pulled, log = asyncio.run(go())
    assert pulled == ["yield 0", "yield 1"]  # the one taken and the one held
    assert log[-1] == "closed"


def test_interval_zero_never_ticks():
    items, _ = run_ticks([(INTERVAL * 3, "a")], interval=0)
    assert items == ["a"]


def test_first_tick_after_first_s():
    async def go():
        log: list[str] = []
        ticks = with_ticks(slow_source([(10, "never")], log), 10, first_s=INTERVAL)
        t0 = time.monotonic()
        first = await anext(ticks)
        waited = time.monotonic() - t0
        await ticks.aclose()
        return first, waited, log
    first, waited, log = asyncio.run(go())
    assert first is TICK and waited < 5
    assert log == ["cancelled", "closed"]


def test_closing_cancels_the_pending_pull_and_closes_the_source():
    """A client that leaves during a wait: the source (the generation) is cancelled at once."""
    async def go():
        log: list[str] = []
        ticks = with_ticks(slow_source([(0, "a"), (30, "b")], log), INTERVAL)
        assert await anext(ticks) == "a"
        assert await anext(ticks) is TICK
        await ticks.aclose()
        return log
    assert asyncio.run(go()) == ["yield a", "cancelled", "closed"]


def test_cancelling_the_consumer_cancels_the_source():
    async def go():
        log: list[str] = []

        async def consume():
            async for _ in with_ticks(slow_source([(30, "a")], log), INTERVAL):
                pass
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(INTERVAL * 3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return log
    assert asyncio.run(go()) == ["cancelled", "closed"]


def test_source_error_passes_through():
    async def failing():
        await asyncio.sleep(INTERVAL * 2.5)
        raise RuntimeError("boom")
        yield  # pragma: no cover

    async def go():
        out = []
        try:
            async for item in with_ticks(failing(), INTERVAL):
                out.append(item)
        except RuntimeError as exc:
            return out, exc
    out, exc = asyncio.run(go())
    assert str(exc) == "boom" and out and all(t is TICK for t in out)


def test_sse_frames_a_tick_as_a_comment():
    async def go():
        async def src():
            yield [{"a": 1}]
            yield TICK
            yield [{"b": 2}]
        return b"".join([p async for p in frame_stream(src(), lambda e: {})])
    assert asyncio.run(go()) == b'data: {"a":1}\n\n' + KEEPALIVE + b'data: {"b":2}\n\ndata: [DONE]\n\n'
    assert KEEPALIVE == b": keep-alive\n\n"
