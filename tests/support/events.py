"""Capture one generation's engine events from a sink (the engine calls it on its own thread)."""

from __future__ import annotations

import threading

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
