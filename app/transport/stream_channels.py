"""Stream channels: what all of a replica's streams for one caller produced in one tick, as one message.

Over Ray Serve's handles every streamed item of every stream is a message of its own at each hop (a gRPC
message, Serve's bookkeeping and an event-loop round on both sides), so a hop's CPU grows with the number of
streams times their chunk rate (docs/history/benchmarks-2026.md, `python -m bench.graph`). Here each request is still one
Serve streaming call, which keeps what the call gives: routing (the prefix router), ongoing-request counts
for autoscaling and `max_ongoing_requests`, cancellation (the caller cancels the call), a dead replica
raised as the call's error, traces. Only its items take another road: the sending replica (the callee)
holds one TCP connection to each caller replica that has streams on it and writes, each time the previous
write is done, one frame with every item its streams made meanwhile. A lone stream's item is written at
once (no timer: the first token never waits for a tick); under load items gather while a write is under
way, so frames per second stay near the connection's own pace whatever the number of streams.

The call itself carries the items when the connection is not up (not yet connected, refused, broken) and
always carries the last one, a `Closing` with the number of items the stream made and its error if it
failed: the caller puts the items of both roads back in order by their sequence numbers and ends the
stream when it has them all. Written in plain asyncio, not through Ray, because the saving is the point:
a Ray call or object per frame would cost what it replaces.

Security: the caller listens on its node's address and accepts a connection only after it presents the
caller's random token (sent inside the Serve call, which Ray carries), compared in constant time; nothing
is unpickled before that, a connection that does not present it within AUTH_TIMEOUT_S is closed, and
unauthenticated connections at once are capped. Frames past MAX_FRAME_BYTES drop the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import pickle
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ray.serve")

TOKEN_BYTES = 16
AUTH_TIMEOUT_S = 10.0
MAX_UNAUTHENTICATED = 32
MAX_FRAME_BYTES = 256 * 1024 * 1024
CONNECT_TIMEOUT_S = 5.0
# A connection with no open stream of its caller closes after this long (a caller that went quiet).
IDLE_CLOSE_S = 30.0
# A caller that could not be reached (a firewall between nodes) is not tried again for this long: its
# streams' items go in their calls meanwhile, as over plain handles.
UNREACHABLE_RETRY_S = 60.0
# After a stream's Closing, how long its items still on the connection may take to arrive.
MISSING_ITEMS_S = 30.0
# After a stream's Closing, how long the end of its call (the sender's generator returning) may take to arrive
# before the call is cancelled.
CALL_END_S = 10.0
_HEADER = 4


@dataclass(frozen=True, slots=True)
class ChannelRoute:
    """Where a stream's items may go: the caller's listening address and token, and the stream's number there."""

    host: str
    port: int
    token: bytes
    stream: int

    @property
    def link(self) -> tuple[str, int, bytes]:
        return self.host, self.port, self.token


@dataclass(frozen=True, slots=True)
class Closing:
    """A stream's last item, always in its own call: how many items it made, why it failed (None: it did not),
    and whether some of its items were lost with a broken connection (the stream fails without waiting for them)."""

    count: int
    error: BaseException | None = None
    lost: bool = False


class ChannelLost(ConnectionError):
    """A stream's connection was lost before all its items came: the caller's `map_error` says it in the protocol's
    terms (deployments/error_mapping.py: a 503 `replica_unavailable`)."""


def channel_lost() -> Exception:
    return ChannelLost("The connection to a replica was lost while streaming; retry shortly.")


# ----------------------------------------------------------------------------------------------------- callee


class _Link:
    """One connection to one caller, with the items waiting for its next write."""

    def __init__(self, route: ChannelRoute, forget: Callable[[_Link], None], sent: Callable[[int], None]) -> None:
        self.route = route
        self._sent = sent
        self.ready = False        # connected and not broken: items may be put
        self.failed = False       # the connection broke or never came up: nothing more is written
        self.connected = False
        self.writer: asyncio.StreamWriter | None = None
        self.open = 0             # streams of this caller being served here
        self.queue: list[tuple[int, int, Any]] = []
        self.pending: dict[int, int] = {}   # stream -> its items put and not yet written
        self.wake = asyncio.Event()
        self.written = asyncio.Event()
        self._forget = forget
        self.task = asyncio.get_running_loop().create_task(self._run())

    def put(self, stream: int, seq: int, batch: Any) -> None:
        self.queue.append((stream, seq, batch))
        self.pending[stream] = self.pending.get(stream, 0) + 1
        self.wake.set()

    async def flushed(self, stream: int) -> bool:
        """Waits until every item of `stream` put so far is written; False when the connection broke first."""
        while self.pending.get(stream):
            if self.failed:
                return False
            self.written.clear()
            await self.written.wait()
        self.pending.pop(stream, None)
        return True

    async def _run(self) -> None:
        try:
            _, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.route.host, self.route.port), CONNECT_TIMEOUT_S)
            writer = self.writer
            writer.write(self.route.token)
            self.connected = self.ready = True
            while True:
                if not self.queue:
                    self.wake.clear()
                    try:
                        await asyncio.wait_for(self.wake.wait(), None if self.open else IDLE_CLOSE_S)
                    except TimeoutError:
                        if not self.open and not self.queue:
                            return  # idle: closed cleanly, at a frame's edge
                    continue
                items, self.queue = self.queue, []
                data = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
                writer.write(len(data).to_bytes(_HEADER, "big") + data)
                await writer.drain()
                self._sent(len(items))
                for stream, _, _ in items:
                    left = self.pending.get(stream, 0) - 1
                    if left > 0:
                        self.pending[stream] = left
                    else:
                        self.pending.pop(stream, None)
                self.written.set()
        except Exception as exc:  # noqa: BLE001 - refused, reset, unpicklable: its streams are told
            log.warning("llamaray: stream channel to %s:%d failed (%r); its streams' items go in their calls",
                        self.route.host, self.route.port, exc)
            self.failed = True
        finally:
            self.ready = False
            if self.pending or self.queue:
                self.failed = True
            self.written.set()
            self._forget(self)
            if self.writer is not None:
                self.writer.close()


class ChannelSender:
    """A replica's side of the channels: a stream's items through its caller's connection when it is up.

    `serve(route, source)` is what the Serve call yields: (seq, batch) items while the connection is not up,
    then a `Closing` once the stream has ended and its connection items are written."""

    def __init__(self) -> None:
        self.links: dict[tuple[str, int, bytes], _Link] = {}
        self.unreachable: dict[tuple[str, int, bytes], float] = {}
        self.frames = self.items = 0  # written (stats, tests)

    def _count(self, items: int) -> None:
        self.frames += 1
        self.items += items

    def info(self) -> dict[str, int]:
        return {"links": len(self.links), "frames_sent": self.frames, "items_sent": self.items}

    def _link(self, route: ChannelRoute) -> _Link | None:
        key = route.link
        link = self.links.get(key)
        if link is None:
            if time.monotonic() < self.unreachable.get(key, 0.0):
                return None
            link = self.links[key] = _Link(route, self._forget, self._count)
        return link

    def _forget(self, link: _Link) -> None:
        key = link.route.link
        if self.links.get(key) is link:
            del self.links[key]
        if not link.connected:
            now = time.monotonic()
            # Callers come and go (a replaced replica listens with a new token): expired entries are dropped.
            self.unreachable = {k: t for k, t in self.unreachable.items() if t > now}
            self.unreachable[key] = now + UNREACHABLE_RETRY_S

    async def serve(self, route: ChannelRoute, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
        link = self._link(route)
        if link is not None:
            link.open += 1
        seq = 0
        used = False
        try:
            try:
                async with contextlib.aclosing(source):
                    async for batch in source:
                        if link is not None and link.ready:
                            link.put(route.stream, seq, batch)
                            used = True
                        else:
                            yield seq, batch
                        seq += 1
            except Exception as exc:  # noqa: BLE001 - sent in order with the items, raised by the caller
                error: BaseException | None = exc
            else:
                error = None
            if used and not await link.flushed(route.stream):
                yield Closing(seq, channel_lost(), lost=True)
            else:
                yield Closing(seq, error)
        finally:
            if link is not None:
                link.open -= 1
                link.wake.set()  # an idle link starts its countdown


# ----------------------------------------------------------------------------------------------------- caller


class _Inbox:
    """One stream's items from both roads, handed out in order."""

    __slots__ = ("items", "next", "count", "error", "wake", "links")

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}
        self.next = 0
        self.count: int | None = None
        self.error: BaseException | None = None
        self.wake = asyncio.Event()
        self.links: set[int] = set()

    def put(self, seq: int, batch: Any) -> None:
        self.items[seq] = batch
        self.wake.set()

    def close(self, closing: Closing) -> None:
        if closing.lost:
            self.fail(closing.error or channel_lost())
            return
        self.count = closing.count
        if closing.error is not None:
            self.error = closing.error
        self.wake.set()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.count = self.next  # nothing more is handed out
        self.items.clear()
        self.wake.set()

    async def take(self) -> list[Any] | None:
        """The next items in order, the batches that are here joined in one list; None at the stream's end."""
        while True:
            if self.next in self.items:
                out = self.items.pop(self.next)
                self.next += 1
                while self.next in self.items:
                    out = out + self.items.pop(self.next)
                    self.next += 1
                return out
            if self.count is not None and self.next >= self.count:
                if self.error is not None:
                    raise self.error
                return None
            self.wake.clear()
            if self.count is None:
                await self.wake.wait()
                continue
            try:  # closed, some items still on the connection
                await asyncio.wait_for(self.wake.wait(), MISSING_ITEMS_S)
            except TimeoutError:
                self.fail(channel_lost())


class ChannelReceiver:
    """A caller replica's side: one listening socket, the streams waiting for their items."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.inboxes: dict[int, _Inbox] = {}
        self._numbers = itertools.count()
        self._links = itertools.count()
        self._server: asyncio.Server | None = None
        self._starting: asyncio.Lock | None = None
        self._unauthenticated = 0
        self._ending: set[asyncio.Task] = set()  # calls whose stream ended, waiting for their end
        self.frames = self.items = 0  # received (stats, tests)

    def info(self) -> dict[str, int]:
        return {"streams": len(self.inboxes), "frames_received": self.frames, "items_received": self.items}

    async def start(self) -> None:
        if self._server is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is None:
                server = await asyncio.start_server(self._accept, self.host, 0)
                self.port = server.sockets[0].getsockname()[1]
                self._server = server

    async def stream(self, start: Callable[[ChannelRoute], Any],
                     map_error: Callable[[BaseException], BaseException]) -> AsyncIterator[list[Any]]:
        """`start(route)` places the Serve streaming call; its items and the connection's come out in order."""
        await self.start()
        number = next(self._numbers)
        inbox = self.inboxes[number] = _Inbox()
        response = reader = None
        ended = False
        try:
            response = start(ChannelRoute(self.host, self.port, self.token, number))
            reader = asyncio.get_running_loop().create_task(self._read_call(response, inbox))
            while (batch := await inbox.take()) is not None:
                yield batch
            ended = True
        except Exception as exc:  # noqa: BLE001 - every failure becomes the protocol's error
            raise map_error(exc) from None
        finally:
            self.inboxes.pop(number, None)
            if not ended:  # failed, or its consumer left: the sender stops at the cancellation
                if reader is not None:
                    reader.cancel()
                if response is not None:
                    response.cancel()
            elif reader is not None and not reader.done():
                # The call's end is one message behind the Closing: it is read, not cancelled (a cancellation
                # costs both replicas a request's worth of Serve's work).
                self._ending.add(reader)
                reader.add_done_callback(self._ending.discard)

    @staticmethod
    async def _read_call(response: Any, inbox: _Inbox) -> None:
        try:
            async for item in response:
                if isinstance(item, Closing):
                    inbox.close(item)
                    await ChannelReceiver._read_end(response)
                    return
                inbox.put(*item)
            inbox.fail(RuntimeError("a stream's call ended without its Closing item"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the call's failure is the stream's
            inbox.fail(exc)

    @staticmethod
    async def _read_end(response: Any) -> None:
        """The call's end after its Closing (the sender yields nothing more); cancelled if it does not come."""
        try:
            async with asyncio.timeout(CALL_END_S):
                async for _ in response:
                    pass
        except TimeoutError:
            response.cancel()
        except Exception:  # noqa: BLE001 - the stream is complete; how its call ended changes nothing
            pass

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = next(self._links)
        clean = False
        authenticated = False
        if self._unauthenticated >= MAX_UNAUTHENTICATED:
            writer.close()
            return
        self._unauthenticated += 1
        try:
            try:
                token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), AUTH_TIMEOUT_S)
            finally:
                self._unauthenticated -= 1
            if not hmac.compare_digest(token, self.token):
                return
            authenticated = True
            while True:
                try:
                    header = await reader.readexactly(_HEADER)
                except asyncio.IncompleteReadError as exc:
                    clean = not exc.partial  # closed between two frames: the sender was idle
                    return
                size = int.from_bytes(header, "big")
                if size > MAX_FRAME_BYTES:
                    log.error("llamaray: a stream channel frame of %d bytes was refused", size)
                    return
                items = pickle.loads(await reader.readexactly(size))
                self.frames += 1
                self.items += len(items)
                for stream, seq, batch in items:
                    inbox = self.inboxes.get(stream)
                    if inbox is not None:  # else: that stream was cancelled here
                        inbox.links.add(link)
                        inbox.put(seq, batch)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            if authenticated and not clean:
                for inbox in self.inboxes.values():
                    if link in inbox.links:
                        inbox.fail(channel_lost())
