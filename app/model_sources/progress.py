"""A download's progress: read by /health at any time, written to the replica's log every few seconds
or every tenth of the file, whichever comes first."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .cache import human_size
from .redact import redacted

log = logging.getLogger("llamaray.model_sources")


class Progress:
    def __init__(self, label: str, *, every_s: float = 5.0, every_share: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] | None = None) -> None:
        self.label = label
        self.every_s, self.every_share, self.clock = every_s, every_share, clock
        self.say = say or log.info
        self.total: int | None = None
        self.done = 0
        self.waiting: str | None = None  # why nothing moves (another replica on this node is fetching)
        self._lock = threading.Lock()
        self._said_at, self._said_done = float("-inf"), 0

    @property
    def label(self) -> str:
        return self._label

    @label.setter
    def label(self, text: str) -> None:
        # What it names is read by /health and written to the log: never a source URL's credentials.
        self._label = redacted(text)

    def begin(self, total: int | None) -> None:
        with self._lock:
            self.total, self.done, self.waiting = total, 0, None
        self.say(f"downloading {self.label}" + (f" ({human_size(total)})" if total else ""))
        self._said_at = self.clock()

    def wait(self, why: str) -> None:
        if why != self.waiting:
            self.say(f"{self.label}: {why}")
        self.waiting = why

    def advance(self, n: int) -> None:
        with self._lock:
            self.done += n
        now = self.clock()
        moved = self.done - self._said_done
        if now - self._said_at >= self.every_s or (self.total and moved >= self.total * self.every_share):
            self._said_at, self._said_done = now, self.done
            self.say(self.text())

    def text(self) -> str:
        if self.waiting:
            return f"{self.label}: {self.waiting}"
        if self.total:
            share = min(100.0, 100.0 * self.done / self.total)
            return f"downloading {self.label}: {human_size(self.done)} of {human_size(self.total)} ({share:.0f}%)"
        return f"downloading {self.label}: {human_size(self.done)}"
