"""What /health answers, from state refreshed in the background at most once a second: a flood of probes
costs one refresh a second, never a request through a model's queue, and a model busy with requests
still reads as ready (a load balancer must not drop the busiest node).

Anyone may probe `/health`; only a caller with a valid key (or any caller on a server without keys) sees
why a model is not ready, since the reasons carry CPU, build and self-check details."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .models import LOADING, ModelState

log = logging.getLogger("llamaray.health")

Refresh = Callable[[], Awaitable[dict[str, ModelState]]]


class HealthCache:
    """The latest states from `refresh`, refreshed when read and older than `interval_s` (one refresh at a
    time, in a task of its own). The first read waits up to `first_wait_s` for the first refresh."""

    def __init__(self, refresh: Refresh, models: list[str], *, interval_s: float = 1.0,
                 first_wait_s: float = 2.0) -> None:
        self.refresh = refresh
        self.models = models
        self.interval_s = interval_s
        self.first_wait_s = first_wait_s
        self.states: dict[str, ModelState] | None = None
        self.refreshed_at = float("-inf")
        self._task: asyncio.Task | None = None

    async def get(self) -> dict[str, ModelState]:
        if self._task is None and time.monotonic() - self.refreshed_at >= self.interval_s:
            self._task = asyncio.ensure_future(self._refresh())
        if self.states is None and self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.first_wait_s)
            except asyncio.TimeoutError:
                pass
        return self.states if self.states is not None else {m: LOADING for m in self.models}

    async def _refresh(self) -> None:
        try:
            self.states = await self.refresh()
        except Exception as exc:  # noqa: BLE001 - keep the last known states; the next read tries again
            log.warning("health refresh failed: %s", exc)
        finally:
            self.refreshed_at = time.monotonic()
            self._task = None


def health_body(states: dict[str, ModelState], models: list[str], detailed: bool) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body): 200 when every model is ready; else 503: `unavailable` when one cannot serve
    (it cannot run here, or fetching it failed), `downloading` when one is being fetched, `loading`
    otherwise; with why each failing model fails (`errors`) and how far each download is (`downloads`) for a caller allowed to see them."""
    current = {m: states.get(m, LOADING) for m in models}
    ok = all(s.ready for s in current.values())
    reasons = {m: s.reason for m, s in current.items() if s.reason and s.failing}
    downloads = {m: s.reason for m, s in current.items() if s.reason and s.state == "downloading"}
    status = ("ok" if ok else "unavailable" if any(s.failing for s in current.values())
              else "downloading" if any(s.state == "downloading" for s in current.values()) else "loading")
    body: dict[str, Any] = {"status": status}
    if detailed:
        body["models"] = {m: s.ready for m, s in current.items()}
        body["states"] = {m: s.state for m, s in current.items()}
        if reasons:
            body["errors"] = reasons
        if downloads:
            body["downloads"] = downloads
    return (200 if ok else 503), body
