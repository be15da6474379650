"""The preparation pool (app/tenants/prep_pool.py): keys take turns, one key holds at most its share of the threads,
a job nobody waits for any more never starts, a running one learns it is cancelled, and the threads stay as many
as the pool was given."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.tenants.prep_pool import PoolFull, PreparationPool, cancelled


def blocker() -> tuple[threading.Event, threading.Event, callable]:
    """A job that says when it started and waits to be released."""
    started, release = threading.Event(), threading.Event()

    def job(value):
        started.set()
        assert release.wait(10)
        return value
    return started, release, job


def test_results_and_errors_reach_the_caller() -> None:
    pool = PreparationPool("t", threads=2)

    async def main():
        assert await pool.run("a", lambda x: x * 2, 21) == 42
        with pytest.raises(ZeroDivisionError):
            await pool.run("a", lambda: 1 / 0)
    asyncio.run(main())


def test_one_key_holds_at_most_its_share_and_another_key_is_served_meanwhile() -> None:
    pool = PreparationPool("t", threads=2, per_key=1)
    started, release, slow = blocker()

    async def main():
        hog = [asyncio.create_task(pool.run("hog", slow, i)) for i in range(5)]
        await asyncio.to_thread(started.wait, 5)
        # The hog's other four jobs wait for its one thread; another key gets the second thread at once.
        t = time.monotonic()
        assert await asyncio.wait_for(pool.run("other", lambda: "served"), 2) == "served"
        assert time.monotonic() - t < 1.0
        assert pool.stats()["busy"] == 1 and pool.stats()["queued"] == {"hog": 4}
        release.set()
        assert await asyncio.gather(*hog) == [0, 1, 2, 3, 4]
    asyncio.run(main())


def test_keys_take_turns() -> None:
    pool = PreparationPool("t", threads=1, per_key=1)
    started, release, slow = blocker()
    order: list[str] = []

    async def main():
        first = asyncio.create_task(pool.run("a", slow, None))
        await asyncio.to_thread(started.wait, 5)
        jobs = [asyncio.create_task(pool.run(k, order.append, k)) for k in ("a", "a", "a", "b", "b", "c")]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, *jobs)
    asyncio.run(main())
    assert order == ["a", "b", "c", "a", "b", "a"]


def test_a_job_nobody_waits_for_never_starts_and_a_running_one_is_told() -> None:
    pool = PreparationPool("t", threads=1)
    started, release, slow = blocker()
    ran: list[str] = []
    saw_cancel = threading.Event()

    def watching():
        started.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not cancelled():
            time.sleep(0.01)
        if cancelled():
            saw_cancel.set()

    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.run("a", watching), 0.2)
        assert saw_cancel.wait(2)  # the running job learnt nobody waits for it
        started.clear()
        blocked = asyncio.create_task(pool.run("a", slow, None))
        await asyncio.to_thread(started.wait, 5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.run("a", ran.append, "late"), 0.1)
        assert pool.stats()["queued"] == {}  # gone from the queue at once
        release.set()
        await blocked
        await pool.run("a", ran.append, "next")
    asyncio.run(main())
    assert ran == ["next"]


def test_the_queue_bound_and_a_constant_thread_count() -> None:
    pool = PreparationPool("bounded", threads=1, max_waiting=1)
    started, release, slow = blocker()

    async def main():
        running = asyncio.create_task(pool.run("a", slow, 1))
        await asyncio.to_thread(started.wait, 5)
        queued = asyncio.create_task(pool.run("b", lambda: 2))
        await asyncio.sleep(0)
        with pytest.raises(PoolFull):
            pool.submit("c", lambda: 3)
        release.set()
        assert await asyncio.gather(running, queued) == [1, 2]
        for _ in range(50):
            await pool.run("d", lambda: None)
    asyncio.run(main())
    assert sum(t.name.startswith("bounded-") for t in threading.enumerate()) == 1


def test_batch_work_waits_for_every_interactive_job_of_its_key() -> None:
    pool = PreparationPool("t", threads=1, per_key=1)
    started, release, slow = blocker()
    order: list[str] = []

    async def main():
        first = asyncio.create_task(pool.run("k", slow, "first"))
        await asyncio.to_thread(started.wait, 5)
        # Queued while the one thread is busy: batch lines first, then interactive requests of the same key.
        low = [asyncio.create_task(pool.run("k", order.append, f"batch{i}", low=True)) for i in range(3)]
        await asyncio.sleep(0.01)
        high = [asyncio.create_task(pool.run("k", order.append, f"chat{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(first, *low, *high)
        assert order == ["chat0", "chat1", "batch0", "batch1", "batch2"]
        assert pool.stats()["queued"] == {}
    asyncio.run(main())
