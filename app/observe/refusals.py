"""What the server refused, as operators read it: one INFO line per refusal (request id, key name, status, code,
route; never the key), and when the same key keeps getting the same refusal, one line per `every_s` that counts
the ones in between. A refusal is the server's choice (a 4xx: limits, validation, not found; or a 503 `overloaded`:
busy), not a fault: ERROR lines and tracebacks are for 5xx the server did not choose, crashes and lost replicas."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ..api.errors import APIError, as_api_error

log = logging.getLogger("llamaray.refusals")

# 503s the server chose because it is busy: a client's retry is the answer, an operator's attention is not.
BUSY_CODES = frozenset({"overloaded", "batch_preempted", "batch_deferred", "pool_busy_for_batch"})


def is_refusal(exc: BaseException | None) -> bool:
    """Whether `exc` is a refusal the server chose (a 4xx, or a busy 503), not a failure."""
    api = as_api_error(exc) if exc is not None else None
    return api is not None and (api.status < 500 or api.code in BUSY_CODES)


class RefusalLog:
    """Refusals logged at INFO, at most one line per (key, status, code) each `every_s`: a key that keeps hitting
    its limit costs the log one line per interval, with the count of those not written. Thread-safe."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log, max_kinds: int = 1024) -> None:
        self.every_s = every_s
        self.clock = clock
        self.logger = logger
        self.max_kinds = max_kinds
        self._last: OrderedDict[tuple[str, int, str], tuple[float, int]] = OrderedDict()  # -> (logged at, held)
        self._lock = threading.Lock()

    def refused(self, error: APIError, *, request_id: str = "", tenant: str = "", route: str = "") -> bool:
        """Log one refusal (or count it for the next line); whether a line was written."""
        kind = (tenant, error.status, error.code or "")
        now = self.clock()
        with self._lock:
            logged_at, held = self._last.get(kind, (None, 0))
            if logged_at is not None and now - logged_at < self.every_s:
                self._last[kind] = (logged_at, held + 1)
                return False
            self._last[kind] = (now, 0)
            self._last.move_to_end(kind)
            while len(self._last) > self.max_kinds:
                self._last.popitem(last=False)
        more = f" (and {held} more like it in the last {self.every_s:g} s)" if held else ""
        self.logger.info("refused %d %s: request %s, key %s, %s: %s%s", error.status, error.code or error.type,
                         request_id or "-", tenant or "-", route or "-", _short(error.message), more)
        return True


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit - 3] + "..."


class RefusalFilter(logging.Filter):
    """For a logger that reports every exception a call raised with its traceback (Ray Serve's replicas log
    "Request failed." for each exception a deployment's method raises): drops the records of refusals, which
    the Ingress logs once, as one line, where the client gets its answer."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not is_refusal(exc)
