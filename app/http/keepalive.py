"""Idle ticks for a stream: proxies and load balancers cut a connection that carries no bytes for a
while (AWS ALB: 60 s), and a stream can wait long with nothing to send (queued behind busy slots, a
model starting, hidden reasoning, a tool-call continuation round).

`with_ticks` yields the source's items as they come and `TICK` after each `interval_s` without one.
The pending `anext` is never cancelled by a tick (cancelling it would cancel the generation): one
task is kept and waited on again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


class Tick:
    """Marks "nothing came for one interval"; the SSE framing writes it as a comment."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TICK"


TICK = Tick()


async def with_ticks(source: AsyncIterator[T], interval_s: float, *,
                     first_s: float | None = None) -> AsyncIterator[T | Tick]:
    """`source`'s items, with `TICK` after every `interval_s` of silence (0: never). `first_s`, when
    given, is the wait before the first tick instead. Closing this closes `source`."""
    pending: asyncio.Task | None = None
    wait = first_s if first_s is not None else interval_s
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=wait if wait > 0 else None)
            if not done:
                wait = interval_s
                yield TICK
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            wait = interval_s
            yield item
    finally:
        # Closed early (client gone, error): stop the pending pull, which cancels the generation,
        # then close the source so its own cleanup runs now rather than at garbage collection.
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await source.aclose()
