"""The skeleton every engine shares: one background thread that drains a queue, and how it ends.

An engine (engine.py, embedder.py, synthetic.py) subclasses DecodeThread and writes `_loop`, its work until
`_closing` is set, and `_fail_all`, which tells every request it still holds that the engine stopped. The
base starts the thread, queues work and wakes it (`_enqueue`), closes and joins it, says whether it is
`healthy`, and when the loop ends, normally or by a crash, marks the engine `broken` (why, for /health and
for later submissions) and fails what it held. A crash is logged and reported, never a silent dead thread.

`_cv` guards the queue and `_closing` (a re-entrant lock: a subclass may check more under it, then queue).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from .errors import EngineError, unavailable

log = logging.getLogger("llamaray.engine")


class DecodeThread:
    JOIN_S = 30.0  # how long `close` waits for the thread to finish its step

    def __init__(self, name: str) -> None:
        self._cv = threading.Condition()
        self._waiting: deque[Any] = deque()
        self._closing = False
        self.broken: str | None = None  # why the engine stopped; None while it serves
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> "DecodeThread":
        self._thread.start()
        return self

    def healthy(self) -> bool:
        return self.broken is None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread (after its current step) and wait for it; subclasses then free what they hold."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=self.JOIN_S)

    def _enqueue(self, item: Any) -> None:
        """`item` into the queue and the thread woken; an engine error (unavailable) once it has stopped."""
        with self._cv:
            if self.broken is None:
                self._waiting.append(item)
                self._cv.notify()
                return
        raise self.unavailable_error()

    def unavailable_error(self) -> EngineError:
        return unavailable(f"The model engine is unavailable: {self.broken}")

    def stopped_error(self) -> EngineError:
        """What the requests still held when the thread ends are told."""
        return unavailable("The model engine stopped.")

    # -- the thread --------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - the thread must report, not vanish
            log.exception("engine thread %s died", self._thread.name)
            self.broken = f"decode loop failed: {exc}"
        finally:
            self.broken = self.broken or "engine closed"
            self._fail_all(self.stopped_error())

    def _loop(self) -> None:
        """The engine's work, until `_closing` is set (then return)."""
        raise NotImplementedError

    def _fail_all(self, error: EngineError) -> None:
        """Every request still queued or running gets `error` (called once, on the thread, as it ends)."""
        raise NotImplementedError
