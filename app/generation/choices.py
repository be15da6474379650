"""Several choices of one request: the model streams them interleaved in one stream (told apart by
`index`); each choice is then read on its own (its parser, its rounds), and their outputs merged
back in arrival order. One choice takes none of this machinery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import TypeVar

from ..engine.events import Event

T = TypeVar("T")
_END = object()


class ChoiceSplitter:
    """One event stream for n choices -> n streams, each with its events' `index` set to 0 (a
    choice's reader sees a plain one-choice stream). Reading starts with the first choice read;
    the source closes (which cancels the generation) when every choice has stopped reading."""

    def __init__(self, source: AsyncIterator[list[Event]], n: int) -> None:
        self.source = source
        self.queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(n)]
        self.open = n
        self.pump: asyncio.Task | None = None

    def choice(self, index: int) -> AsyncIterator[list[Event]]:
        return self._read(index)

    async def _read(self, index: int) -> AsyncIterator[list[Event]]:
        if self.pump is None:
            self.pump = asyncio.ensure_future(self._pump())
        try:
            while (item := await self.queues[index].get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.open -= 1
            if self.open == 0:
                self.pump.cancel()

    async def _pump(self) -> None:
        try:
            async for batch in self.source:
                split: dict[int, list[Event]] = {}
                for ev in batch:
                    index = getattr(ev, "index", 0)
                    split.setdefault(index, []).append(replace(ev, index=0) if index else ev)
                for index, events in split.items():
                    self.queues[index].put_nowait(events)
            ends: list[object] = [_END] * len(self.queues)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a failure reaches every choice
            ends = [exc] * len(self.queues)
        finally:
            await self.source.aclose()
        for queue, end in zip(self.queues, ends):
            queue.put_nowait(end)


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) from several streams as items arrive; the first error ends them all. A caller
    that stops early closes every stream at once (which cancels their generations)."""
    if len(streams) == 1:  # no tasks for the common case
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def drain(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item, None))
            queue.put_nowait((index, _END, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there
            queue.put_nowait((index, _END, exc))
        finally:
            await stream.aclose()

    tasks = [asyncio.ensure_future(drain(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is _END:
                running -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
