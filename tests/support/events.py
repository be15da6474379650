"""Capture one generation's engine events from a sink (the engine calls it on its own thread)."""

from __future__ import annotations

import asyncio
import threading
import time

from app.engine.events import Event, Failed, Finished, Started, Text


class EventBox:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self._done.set()

    def wait(self, timeout: float = 30.0) -> bool:
        return self._done.wait(timeout)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Text))

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
