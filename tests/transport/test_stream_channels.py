"""Stream channels (app/transport/stream_channels.py) with real sockets on this machine: a sender and a receiver
on one event loop, each "Serve call" a task that runs the sender's side of the stream as a replica would."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket

import pytest

from app.api.errors import APIError
from app.transport import stream_channels as sc


class Call:
    """A Serve streaming call as the receiver sees one: async iteration over what the callee yields, and cancel()."""

    def __init__(self, gen) -> None:
        self.gen = gen
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.gen.__anext__()

    def cancel(self) -> None:
        self.cancelled = True
        asyncio.get_running_loop().create_task(self.gen.aclose())


async def source(n: int, *, tick: asyncio.Event | None = None, fail_after: int | None = None, closed=None):
    try:
        for i in range(n):
            if tick is not None:
                await tick.wait()
            if fail_after is not None and i == fail_after:
                raise APIError("bad thing", status=400)
            yield [f"t{i}"]
            await asyncio.sleep(0)
    finally:
        if closed is not None:
            closed.append(True)


def mapped(exc: BaseException) -> BaseException:
    return exc


async def collect(receiver, sender, src) -> list[str]:
    out: list[str] = []
    async for batch in receiver.stream(lambda route: Call(sender.serve(route, src)), mapped):
        out.extend(batch)
    return out


async def until(cond, timeout=5.0):
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


async def connected() -> tuple[sc.ChannelReceiver, sc.ChannelSender]:
    """A receiver and a sender whose connection is up (a first stream opened it)."""
    receiver, sender = sc.ChannelReceiver("127.0.0.1"), sc.ChannelSender()
    assert await collect(receiver, sender, source(2)) == ["t0", "t1"]
    await until(lambda: any(link.ready for link in sender.links.values()))
    return receiver, sender


def test_many_streams_arrive_whole_and_in_order_in_fewer_frames_than_items():
    async def main():
        receiver, sender = sc.ChannelReceiver("127.0.0.1"), sc.ChannelSender()
        first = await collect(receiver, sender, source(3))  # opens the connection
        assert first == ["t0", "t1", "t2"]
        await until(lambda: any(link.ready for link in sender.links.values()))
        frames = receiver.frames
        results = await asyncio.gather(*(collect(receiver, sender, source(40)) for _ in range(32)))
        for r in results:
            assert r == [f"t{i}" for i in range(40)]
        sent = receiver.frames - frames
        assert 0 < sent < 32 * 40 / 4, sent  # items of many streams shared frames
        assert not receiver.inboxes
    asyncio.run(main())


def test_an_unreachable_caller_gets_every_item_in_the_calls():
    async def main():
        receiver, sender = sc.ChannelReceiver("127.0.0.1"), sc.ChannelSender()
        await receiver.start()
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            receiver.port = s.getsockname()[1]
        sender.unreachable[("10.0.0.9", 1, b"gone")] = 0.0  # a caller that went away long ago
        assert await collect(receiver, sender, source(20)) == [f"t{i}" for i in range(20)]
        await until(lambda: not sender.links)
        assert list(sender.unreachable) == [("127.0.0.1", receiver.port, receiver.token)]  # expired entries go
        assert await collect(receiver, sender, source(5)) == [f"t{i}" for i in range(5)]
        assert receiver.frames == 0
    asyncio.run(main())


def test_a_failure_comes_after_the_items_before_it():
    async def main():
        receiver, sender = await connected()
        got: list[str] = []
        with pytest.raises(APIError) as err:
            async for batch in receiver.stream(lambda r: Call(sender.serve(r, source(30, fail_after=25))), mapped):
                got.extend(batch)
        assert got == [f"t{i}" for i in range(25)]
        assert err.value.status == 400
    asyncio.run(main())


def test_a_consumer_that_stops_closes_the_source_and_the_others_go_on():
    async def main():
        receiver, sender = await connected()
        tick, closed = asyncio.Event(), []
        tick.set()
        calls: list[Call] = []

        def start(route):
            calls.append(Call(sender.serve(route, source(10_000, closed=closed))))
            return calls[-1]

        quitter = receiver.stream(start, mapped)
        assert (await quitter.__anext__())[0] == "t0"
        other = asyncio.create_task(collect(receiver, sender, source(50)))
        await quitter.aclose()
        assert calls[0].cancelled
        await until(lambda: closed == [True])
        assert await other == [f"t{i}" for i in range(50)]
        await until(lambda: all(link.open == 0 for link in sender.links.values()))
    asyncio.run(main())


def test_a_stream_that_ends_reads_its_calls_end_instead_of_cancelling_it():
    async def main():
        receiver, sender = await connected()
        calls: list[Call] = []
        ended: list[bool] = []

        async def sender_side(route):
            async for item in sender.serve(route, source(30)):
                yield item
            ended.append(True)  # the generator returned after its Closing: the call ends on its own

        def start(route):
            calls.append(Call(sender_side(route)))
            return calls[-1]

        got = [t async for batch in receiver.stream(start, mapped) for t in batch]
        assert got == [f"t{i}" for i in range(30)]
        await until(lambda: ended == [True] and not receiver._ending)
        assert not calls[0].cancelled
    asyncio.run(main())


def test_a_call_whose_end_does_not_come_after_its_closing_is_cancelled(monkeypatch):
    monkeypatch.setattr(sc, "CALL_END_S", 0.2)

    async def main():
        receiver, sender = await connected()
        calls: list[Call] = []
        release = asyncio.Event()

        async def stuck_after_closing(route):
            async for item in sender.serve(route, source(3)):
                yield item
            await release.wait()  # a sender that neither yields nor returns

        def start(route):
            calls.append(Call(stuck_after_closing(route)))
            return calls[-1]

        got = [t async for batch in receiver.stream(start, mapped) for t in batch]
        assert got == ["t0", "t1", "t2"] and not calls[0].cancelled
        await until(lambda: calls[0].cancelled and not receiver._ending)
    asyncio.run(main())


def test_a_connection_lost_mid_stream_fails_its_streams_instead_of_hanging():
    async def main():
        receiver, sender = await connected()
        gate = asyncio.Event()

        async def slow():
            for i in range(1000):
                yield [f"t{i}"]
                if i == 5:
                    await gate.wait()

        got: list[str] = []

        async def consume():
            async for batch in receiver.stream(lambda r: Call(sender.serve(r, slow())), mapped):
                got.extend(batch)

        task = asyncio.create_task(consume())
        await until(lambda: len(got) >= 6)
        for link in list(sender.links.values()):  # the connection is reset under the stream
            link.writer.transport.abort()
        gate.set()
        with pytest.raises(sc.ChannelLost) as err:
            async with asyncio.timeout(10):
                await task
        from deployments.error_mapping import to_api_error  # what the deployments' callers make of it

        api = to_api_error(err.value)
        assert (api.status, api.code) == (503, "replica_unavailable")
    asyncio.run(main())


def test_the_listener_refuses_a_wrong_token_and_a_silent_peer():
    async def main():
        receiver = sc.ChannelReceiver("127.0.0.1")
        await receiver.start()
        inbox = receiver.inboxes[0] = sc._Inbox()
        frame = pickle.dumps([(0, 0, ["forged"])])
        _, w = await asyncio.open_connection("127.0.0.1", receiver.port)
        w.write(b"x" * sc.TOKEN_BYTES + len(frame).to_bytes(4, "big") + frame)
        await w.drain()
        r2, w2 = await asyncio.open_connection("127.0.0.1", receiver.port)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(sc.AUTH_TIMEOUT_S + 5):
                assert await r2.read() == b""  # closed by the listener without a token
        assert not inbox.items and receiver.frames == 0
        w.close()
        w2.close()
    sc.AUTH_TIMEOUT_S, saved = 0.3, sc.AUTH_TIMEOUT_S
    try:
        asyncio.run(main())
    finally:
        sc.AUTH_TIMEOUT_S = saved


def test_a_frame_past_the_limit_drops_the_connection(monkeypatch):
    async def main():
        receiver = sc.ChannelReceiver("127.0.0.1")
        await receiver.start()
        r, w = await asyncio.open_connection("127.0.0.1", receiver.port)
        w.write(receiver.token + (sc.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        await w.drain()
        async with asyncio.timeout(5):
            assert await r.read() == b""
        w.close()
    asyncio.run(main())
