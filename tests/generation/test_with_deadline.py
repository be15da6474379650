"""`with_deadline` (app/generation/rounds.py), which every generated reply is read through: items pass in order,
a source that goes quiet past the deadline is stopped with a 504 and closed (its generation cancelled, its slot
freed), and a reader cancelled from outside is not turned into a timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.api.errors import APIError
from app.generation.rounds import with_deadline


class Source:
    """An event stream that yields `items`, then waits `stall_s`; records whether it was started and closed."""

    def __init__(self, items: list[int], stall_s: float = 0.0) -> None:
        self.items, self.stall_s, self.started, self.closed = items, stall_s, False, False

    async def events(self):
        self.started = True
        try:
            for item in self.items:
                yield item
            await asyncio.sleep(self.stall_s)
        finally:
            self.closed = True


async def read(source: Source, within_s: float) -> list[int]:
    return [i async for i in with_deadline(source.events(), time.monotonic() + within_s, within_s)]


def test_items_pass_in_order_and_the_source_is_closed_at_its_end():
    source = Source([1, 2, 3])
    assert asyncio.run(read(source, 5.0)) == [1, 2, 3]
    assert source.closed


def test_a_source_quiet_past_the_deadline_ends_in_a_504_and_is_closed():
    source = Source([1], stall_s=30.0)
    got: list[int] = []

    async def main():
        async for item in with_deadline(source.events(), time.monotonic() + 0.2, 0.2):
            got.append(item)

    start = time.monotonic()
    with pytest.raises(APIError) as info:
        asyncio.run(main())
    assert info.value.status == 504
    assert got == [1]  # what came before the deadline was delivered
    assert source.closed
    assert time.monotonic() - start < 5.0


def test_a_deadline_already_past_reads_nothing():
    source = Source([1, 2])
    with pytest.raises(APIError) as info:
        asyncio.run(read(source, -1.0))
    assert info.value.status == 504
    assert not source.started  # not one item was asked of it: no generation to cancel


def test_a_cancelled_reader_is_cancelled_not_timed_out():
    source = Source([], stall_s=30.0)

    async def main():
        task = asyncio.create_task(read(source, 60.0))
        until = time.monotonic() + 5.0
        while not source.started and time.monotonic() < until:  # the reader is waiting on the source
            await asyncio.sleep(0)
        assert source.started
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert source.closed


def test_a_long_stream_runs_no_task_per_item():
    """The per-item timeout runs in the reader's task: wait_for made a task for each item."""
    made = 0

    async def main():
        loop = asyncio.get_running_loop()
        factory = loop.get_task_factory()

        def counting(loop, coro, **kwargs):
            nonlocal made
            made += 1
            return asyncio.Task(coro, loop=loop, **kwargs) if factory is None else factory(loop, coro, **kwargs)

        loop.set_task_factory(counting)
        try:
            assert await read(Source(list(range(200))), 5.0) == list(range(200))
        finally:
            loop.set_task_factory(factory)

    asyncio.run(main())
    assert made == 0


def test_the_deadline_passing_in_the_readers_own_code_does_not_cancel_it():
    """The deadline cancels only a wait for the source: a reader busy with an item past the deadline finishes
    that work (a slow client's write is never cut in the middle), and its next wait ends in the 504."""
    source = Source([1, 2], stall_s=30.0)
    got: list[int] = []
    finished_work = []

    async def main():
        async for item in with_deadline(source.events(), time.monotonic() + 0.1, 0.1):
            got.append(item)
            await asyncio.sleep(0.3)  # the reader's own work, past the deadline
            finished_work.append(item)

    with pytest.raises(APIError) as info:
        asyncio.run(main())
    assert info.value.status == 504
    assert got == finished_work == [1]
    assert source.closed


def test_one_timer_per_reply_not_per_item_and_it_is_cancelled_at_the_end():
    handles: list[asyncio.TimerHandle] = []

    async def main():
        loop = asyncio.get_running_loop()
        call_at = loop.call_at

        def counting(when, callback, *args, **kwargs):
            handle = call_at(when, callback, *args, **kwargs)
            handles.append(handle)
            return handle

        loop.call_at = counting  # call_later goes through call_at too
        try:
            assert await read(Source(list(range(200))), 5.0) == list(range(200))
        finally:
            del loop.call_at

    asyncio.run(main())
    assert len(handles) == 1 and handles[0].cancelled()
