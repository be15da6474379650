"""A replica's model files being made ready (fetched, checked) in a background thread, so the replica
answers at once and all along: /health and requests say "downloading" with progress, or why it failed,
instead of a constructor that blocks Serve's health checks or a crash Serve would restart forever.

A failure that another try may fix (network, disk full, Hub offline) is tried again on a later health
check, after 30 s, then twice as long each time up to 10 minutes. One that needs a change of config,
secrets or files (not found, access denied, checksum mismatch) is not: redeploying tries again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..config.spec import ModelSpec
from ..model_sources.fetch import FetchError
from ..model_sources.progress import Progress
from ..model_sources.redact import redacted
from ..serving.models import ModelState
from .local_copy import fetch_spec

log = logging.getLogger("llamaray.model_sources")

FIRST_RETRY_S = 30.0
LAST_RETRY_S = 600.0


class Preparation:
    def __init__(self, spec: ModelSpec, ready: Callable[[ModelSpec], None], *,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 retry_s: tuple[float, float] = (FIRST_RETRY_S, LAST_RETRY_S)) -> None:
        """`ready(spec)` is called on the background thread with the spec of local files; `on_change`
        whenever the state changes (to publish it)."""
        self.spec, self.ready, self.on_change, self.clock = spec, ready, on_change, clock
        self.progress = Progress(spec.source or spec.path)
        self.failure: FetchError | None = None
        self.fetched = False
        self.retry_at: float | None = None
        self._delay, self._max_delay = retry_s
        self._thread: threading.Thread | None = None
        self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"llamaray-fetch-{self.spec.id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            spec = fetch_spec(self.spec, self.progress)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the replica up, saying why
            failure = exc if isinstance(exc, FetchError) else FetchError("network", f"{type(exc).__name__}: {exc}")
            self.retry_at = None if failure.lasting else self.clock() + self._delay
            self.failure = failure
            log.error("model %r: %s", self.spec.id, self.state().reason)
            self.on_change()
            return
        self.fetched = True
        log.info("model %r: %s is ready at %s", self.spec.id, redacted(self.spec.source) or "the model", spec.path)
        self.on_change()
        self.ready(spec)
        self.on_change()

    def state(self) -> ModelState | None:
        """`downloading` (with progress) or `failed` (why, and when the next try is); None once fetched."""
        if self.failure is not None:
            retry = (f"; next try in {max(0.0, self.retry_at - self.clock()):.0f} s" if self.retry_at is not None
                     else "; not retried (fix the config, secrets or file, then redeploy)")
            return ModelState("failed", f"model {self.spec.id!r} could not be fetched: {self.failure}{retry}")
        if not self.fetched:
            return ModelState("downloading", self.progress.text())
        return None

    @property
    def busy(self) -> bool:
        """A try is under way (its thread still runs)."""
        return self._thread is not None and self._thread.is_alive()

    def maybe_retry(self) -> bool:
        """Start another try when a retryable failure's wait is over (called from health checks)."""
        if self.failure is None or self.retry_at is None or self.clock() < self.retry_at:
            return False
        if self.busy:
            return False
        log.info("model %r: fetching again after: %s", self.spec.id, self.failure)
        self._delay = min(self._delay * 2, self._max_delay)
        self.failure, self.retry_at = None, None
        self.progress = Progress(self.spec.source or self.spec.path)
        self._start()
        self.on_change()
        return True
