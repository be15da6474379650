"""Capture one generation's engine events from a sink (the engine calls it on its own thread)."""

from __future__ import annotations

import asyncio
import threading
import time

from app.engine.events import Event, Failed, Finished, Started, Text


class EventBox:
    """Done at the first `Failed`, or when all `n` choices have finished."""

    def __init__(self, n: int = 1) -> None:
        self.events: list[Event] = []
        self.n = n
        self._done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        finished = sum(isinstance(e, Finished) for e in self.events)
        if isinstance(event, Failed) or finished >= self.n:
            self._done.set()

    def wait(self, timeout: float = 30.0) -> bool:
        return self._done.wait(timeout)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Text))

    def text_of(self, index: int) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Text) and e.index == index)

    def of(self, kind: type, index: int = 0) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind) and getattr(e, "index", 0) == index]

    @property
    def logprobs(self) -> list:
        return [lp for e in self.events if isinstance(e, Text) for lp in e.logprobs]

    @property
    def started(self) -> Started | None:
        return next((e for e in self.events if isinstance(e, Started)), None)

    @property
    def last(self) -> Event:
        return self.events[-1]


async def wait_idle(engine, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")


def run_until_idle(engine, coro):
    """asyncio.run that lets the shared engine finish before the loop closes: events the engine
    still delivers to a closed loop would be lost, and a later test would find the slot busy."""
    async def wrapper():
        try:
            return await coro
        finally:
            await wait_idle(engine)
    return asyncio.run(wrapper())


def assert_same_distribution(a, b, tol: float = 0.3) -> None:
    """Two TokenLogprobs for one position computed in batches of different shapes (a reused or copied KV
    prefix against a whole prefill): the same distribution, up to rounding. Rounding differs by batch shape
    in every layer and, in this 4-bit model, moves a logprob by up to about 0.06 (seen here); a wrong KV (a
    prefix lost or shifted) moves the distribution by whole nats. A near-tie may still swap the sampled
    token, which is why tests compare distributions there, not texts."""
    top_a, top_b = dict(a.top), dict(b.top)
    shared = set(top_a) & set(top_b)
    assert len(shared) >= min(len(top_a), len(top_b)) - 1, (a, b)
    for token in shared:
        assert abs(top_a[token] - top_b[token]) < tol, (token, top_a[token], top_b[token])
