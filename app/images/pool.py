"""Image decoding's own few threads, with a bounded queue, apart from the event loop's default executor
where every request's prompt is planned (app/generation/lifecycle.py `off_loop`): images wait on each
other, never on prompt planning, and a burst of slow images cannot make other keys' plain requests miss
their planning deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Pillow releases the GIL while it decodes: two threads give images at most two cores of this process,
# the rest stays with planning, SSE and the event loop.
THREADS = 2
# Images waiting for a thread, over every request of this process. The wait is bounded in time too
# (limits.image_decode_timeout_s); this bounds the encoded bytes held in the queue.
MAX_WAITING = 32


class DecodePool:
    def __init__(self, threads: int = THREADS, max_waiting: int = MAX_WAITING) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="image-decode")
        self._capacity = threads + max_waiting
        self._held = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T] | None:
        """`fn(*args)` on a decoding thread, or None when the queue is full."""
        with self._lock:
            if self._held >= self._capacity:
                return None
            self._held += 1
        future = self._executor.submit(fn, *args)
        future.add_done_callback(self._release)  # cancelled ones too
        return future

    def _release(self, _: Future[Any]) -> None:
        with self._lock:
            self._held -= 1


POOL = DecodePool()
