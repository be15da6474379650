"""PoolManager with a fake engine: loads on first use, LRU eviction of idle models only, pinned models kept,
idle unloading, one load shared by concurrent cold requests, 503s for a full pool of busy models, a model
over the budget and a failed load (the other models keep serving)."""

from __future__ import annotations

import asyncio

import pytest

from app.api.errors import APIError
from app.engine.jobs import StatsJob, TokenizeJob
from app.pools.hosted import PooledHost
from app.pools.manager import DEMAND_HALF_LIFE_S, PoolManager
from app.pools.plan import MIB, PoolPlan


class FakeEngine:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.closed = False

    async def generate(self, request, *, bounded=False):
        for piece in (f"{self.model_id}:", request):
            yield [piece]

    async def run(self, job, *, bounded=False):
        return (self.model_id, job, bounded)

    def stats(self) -> dict:
        return {"model": self.model_id, "running": 0}

    def close(self) -> None:
        self.closed = True


class Loader:
    """Counts loads; a model in `broken` fails to load; `gate` (when set) holds every load until released."""

    def __init__(self, broken: dict[str, str] | None = None) -> None:
        self.loads: list[str] = []
        self.broken = broken or {}
        self.gate: asyncio.Event | None = None
        self.engines: dict[str, FakeEngine] = {}

    async def load(self, model_id: str) -> FakeEngine:
        self.loads.append(model_id)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        if model_id in self.broken:
            raise RuntimeError(self.broken[model_id])
        self.engines[model_id] = FakeEngine(model_id)
        return self.engines[model_id]

    async def unload(self, engine: FakeEngine) -> None:
        engine.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(models=("a", "b", "c"), *, max_models=2, loader=None, clock=None, **plan):
    loader = loader or Loader()
    events: list[tuple[str, str, object]] = []
    needs = plan.pop("needs", None) or {m: 0 for m in models}
    manager = PoolManager(PoolPlan("tail", max_models, needs=needs, **plan), loader.load, loader.unload,
                          on_event=lambda *e: events.append(e), clock=clock or Clock())
    return manager, loader, events


async def answer(manager: PoolManager, model_id: str, text: str = "hi") -> list[str]:
    out = []
    async for batch in PooledHost(manager, model_id).generate(text):
        out += batch
    return out


def test_first_request_loads_and_the_model_answers():
    async def run():
        manager, loader, events = make()
        assert manager.states() == {"a": "available", "b": "available", "c": "available"}
        assert await answer(manager, "a") == ["a:", "hi"]
        assert await answer(manager, "a", "again") == ["a:", "again"]
        assert loader.loads == ["a"]
        assert manager.state("a") == "loaded"
        assert [e[:2] for e in events] == [("loaded", "a")]
    asyncio.run(run())


def test_of_models_asked_as_often_the_least_recently_used_idle_one_is_evicted():
    async def run():
        clock = Clock()
        manager, loader, events = make(clock=clock)
        for model_id in ("b", "a"):  # once each: b is the least recently used (its one request counts less now)
            clock.now += 1
            await answer(manager, model_id)
        clock.now += 1
        assert await answer(manager, "c") == ["c:", "hi"]
        await asyncio.sleep(0)
        assert set(manager.loaded()) == {"a", "c"}
        assert loader.engines["b"].closed and not loader.engines["a"].closed
        assert ("evicted", "b", "lru") in events
    asyncio.run(run())


def test_the_idle_model_least_in_demand_goes_first_and_demand_fades():
    """A popular model survives a run of rare ones (each would be a cold load again later); once nobody asks for it,
    its requests count for less every DEMAND_HALF_LIFE_S and a model asked for now outlasts it."""
    async def run():
        clock = Clock()
        manager, _, events = make(("a", "b", "c", "d"), clock=clock)
        for _ in range(3):
            await answer(manager, "a")
        for model_id in ("b", "c"):  # a is the least recently used each time, but asked for three times
            clock.now += 1
            await answer(manager, model_id)
        assert set(manager.loaded()) == {"a", "c"} and ("evicted", "b", "lru") in events
        assert 2.9 < manager.demand("a") < 3
        clock.now += 10 * DEMAND_HALF_LIFE_S
        await answer(manager, "c")
        assert manager.demand("a") < 0.01 and manager.demand("c") > 1
        await answer(manager, "d")
        assert set(manager.loaded()) == {"c", "d"} and ("evicted", "a", "lru") in events
    asyncio.run(run())


def test_pinned_model_is_never_evicted():
    async def run():
        clock = Clock()
        manager, loader, events = make(("p", "a", "b", "c"), clock=clock, pinned=("p",))
        manager.adopt("p", FakeEngine("p"))
        for model_id in ("a", "b", "c", "a"):  # p is the least recently used throughout
            clock.now += 1
            assert await answer(manager, model_id) == [f"{model_id}:", "hi"]
        assert "p" in manager.loaded()
        assert not any(e[0] == "evicted" and e[1] == "p" for e in events)
        assert [e[1] for e in events if e[0] == "evicted"] == ["a", "b", "c"]
    asyncio.run(run())


def test_idle_models_are_unloaded_after_idle_unload_s():
    async def run():
        clock = Clock()
        manager, loader, events = make(("p", "a", "b"), max_models=3, clock=clock, idle_unload_s=60, pinned=("p",))
        manager.adopt("p", FakeEngine("p"))
        await answer(manager, "a")
        clock.now += 30
        await answer(manager, "b")
        clock.now += 31  # a idle 61 s, b 31 s
        assert manager.reap_idle() == ["a"]
        clock.now += 30
        assert manager.reap_idle() == ["b"]
        assert set(manager.loaded()) == {"p"}
        await manager.close()
    asyncio.run(run())


def test_a_model_in_use_is_not_unloaded_when_idle_time_passes():
    async def run():
        clock = Clock()
        manager, _, _ = make(clock=clock, idle_unload_s=10)
        async with manager.use("a"):
            clock.now += 100
            assert manager.reap_idle() == []
        await manager.close()
    asyncio.run(run())


def test_concurrent_requests_for_a_cold_model_share_one_load():
    async def run():
        loader = Loader()
        loader.gate = asyncio.Event()
        manager, _, _ = make(loader=loader)
        waiting = [asyncio.ensure_future(answer(manager, "a", str(i))) for i in range(5)]
        await asyncio.sleep(0.01)
        assert manager.state("a") == "loading"
        loader.gate.set()
        replies = await asyncio.gather(*waiting)
        assert replies == [["a:", str(i)] for i in range(5)]
        assert loader.loads == ["a"]
    asyncio.run(run())


def test_a_waiter_leaving_does_not_cancel_the_load_of_the_others():
    async def run():
        loader = Loader()
        loader.gate = asyncio.Event()
        manager, _, _ = make(loader=loader)
        leaving = asyncio.ensure_future(answer(manager, "a", "1"))
        staying = asyncio.ensure_future(answer(manager, "a", "2"))
        await asyncio.sleep(0.01)
        leaving.cancel()
        loader.gate.set()
        assert await staying == ["a:", "2"]
        assert loader.loads == ["a"]
    asyncio.run(run())


def test_a_pool_full_of_busy_models_answers_503_with_retry_after():
    async def run():
        manager, loader, _ = make(room_wait_s=0)
        async with manager.use("a"), manager.use("b"):
            with pytest.raises(APIError) as refused:
                await answer(manager, "c")
        assert refused.value.status == 503 and refused.value.code == "overloaded"
        assert refused.value.headers["Retry-After"].isdigit()
        assert "'tail'" in refused.value.message and "'c'" in refused.value.message
        assert loader.loads == ["a", "b"]
        assert await answer(manager, "c") == ["c:", "hi"]  # once one is free, it makes room
    asyncio.run(run())


def test_a_request_for_a_cold_model_waits_for_a_busy_one_to_go_idle():
    async def run():
        manager, loader, events = make(room_wait_s=30)
        release = asyncio.Event()

        async def hold(model_id: str) -> None:
            async with manager.use(model_id):
                await release.wait()

        holders = [asyncio.ensure_future(hold(m)) for m in ("a", "b")]
        await asyncio.sleep(0.01)
        cold = asyncio.ensure_future(answer(manager, "c"))
        await asyncio.sleep(0.05)
        assert not cold.done() and loader.loads == ["a", "b"]  # waiting, not refused
        release.set()
        assert await asyncio.wait_for(cold, 5) == ["c:", "hi"]
        await asyncio.gather(*holders)
        assert loader.loads == ["a", "b", "c"] and ("evicted", "a", "lru") in events
        # The wait is reported once, apart from the load (a and b never waited).
        waits = [detail for event, _, detail in events if event == "room_waited"]
        assert len(waits) == 1 and 0.04 <= waits[0] < 5
    asyncio.run(run())


def test_later_requests_for_the_model_a_cold_request_waits_for_do_not_keep_it_busy():
    """A cold request claims the held model with the fewest requests: requests for that model that come after it
    wait (a batch line is told to come back), and it loads once the requests ahead of it end."""
    async def run():
        manager, loader, events = make(room_wait_s=30, claim_after_s=0)
        release = {m: asyncio.Event() for m in ("a1", "a2", "b")}

        async def hold(model_id: str, gate: str) -> str:
            async with manager.use(model_id):
                await release[gate].wait()
            return gate

        first = [asyncio.ensure_future(hold("a", "a1")), asyncio.ensure_future(hold("a", "a2")),
                 asyncio.ensure_future(hold("b", "b"))]
        await asyncio.sleep(0.01)
        cold = asyncio.ensure_future(answer(manager, "c"))
        await asyncio.sleep(0.01)
        later = asyncio.ensure_future(answer(manager, "b", "later"))  # b has the fewer requests: c claimed it
        await asyncio.sleep(0.05)
        assert not cold.done() and not later.done() and manager.entries["b"].active == 1
        with pytest.raises(APIError) as batch:
            async with manager.use("b", evict=False):
                pass
        assert batch.value.code == "pool_busy_for_batch"
        assert await answer(manager, "a", "warm") == ["a:", "warm"]  # the unclaimed model serves on
        release["b"].set()
        assert await asyncio.wait_for(cold, 5) == ["c:", "hi"]  # b's one request ended: c did not wait for later
        assert ("claimed", "b", None) in events and ("evicted", "b", "lru") in events
        release["a1"].set()
        release["a2"].set()
        assert await asyncio.wait_for(later, 5) == ["b:", "later"]  # then b comes back in a's or c's place
        await asyncio.gather(*first)
        assert loader.loads == ["a", "b", "c", "b"]
    asyncio.run(run())


def test_a_claim_comes_after_claim_after_s_and_ends_with_its_waiter():
    async def run():
        manager, loader, _ = make(room_wait_s=3, claim_after_s=0.5)
        async with manager.use("a"), manager.use("b"):
            waiting = asyncio.ensure_future(answer(manager, "c"))
            await asyncio.sleep(0.05)
            assert await answer(manager, "a", "early") == ["a:", "early"]  # not claimed yet: a serves
            assert not manager._claimed
            await asyncio.sleep(0.7)
            assert manager._claimed == {"a"}  # claimed without any room change meanwhile (a, b tied: a by name)
            later = asyncio.ensure_future(answer(manager, "a", "later"))
            await asyncio.sleep(0.05)
            assert not later.done()
            with pytest.raises(APIError):
                await waiting  # room_wait_s passed: its 503, and its claim let go
            assert await asyncio.wait_for(later, 5) == ["a:", "later"]
        assert loader.loads == ["a", "b"] and not manager._claimed
    asyncio.run(run())


def test_room_now_counts_free_places_and_idle_models_it_may_evict():
    async def run():
        manager, _, _ = make(("a", "b", "c"), max_models=2, pinned=("b",))
        assert manager.room_now() == manager.free_now() == 2  # nothing held
        async with manager.use("a"):
            assert manager.room_now() == manager.free_now() == 1  # a busy: one free place
            await answer(manager, "b")
            assert manager.room_now() == manager.free_now() == 0  # a busy, b pinned
        assert manager.room_now() == 1 and manager.free_now() == 0  # a idle: it may go, but no place is free
        manager.set_pinned("b", False)
        assert manager.room_now() == 2 and manager.free_now() == 0
    asyncio.run(run())


def test_ahead_now_counts_the_requests_the_soonest_room_waits_for():
    async def run():
        manager, _, _ = make(("a", "b", "c"), max_models=2, pinned=("b",), claim_after_s=0)
        assert manager.ahead_now() is None  # nothing held that could go
        async with manager.use("a"), manager.use("a"), manager.use("b"):
            assert manager.room_now() == 0 and manager.ahead_now() == 2  # a's two requests (b is pinned)
            waiting = asyncio.ensure_future(answer(manager, "c"))
            await asyncio.sleep(0.01)
            assert manager.ahead_now() is None  # a is claimed by the request waiting for it
        assert await asyncio.wait_for(waiting, 5) == ["c:", "hi"]
    asyncio.run(run())


def test_a_request_waits_for_room_no_longer_than_room_wait_s_then_503():
    async def run():
        manager, loader, _ = make(room_wait_s=0.2)
        async with manager.use("a"), manager.use("b"):
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(APIError) as refused:
                await answer(manager, "c")
            assert 0.15 <= loop.time() - started < 2.0
        assert refused.value.status == 503 and refused.value.headers["Retry-After"].isdigit()
        assert loader.loads == ["a", "b"]
    asyncio.run(run())


def test_an_unpinned_model_makes_room_for_a_waiting_request():
    async def run():
        manager, loader, _ = make(max_models=1, room_wait_s=30, pinned=("a",))
        assert await answer(manager, "a") == ["a:", "hi"]
        cold = asyncio.ensure_future(answer(manager, "b"))
        await asyncio.sleep(0.05)
        assert not cold.done()
        manager.set_pinned("a", False)
        assert await asyncio.wait_for(cold, 5) == ["b:", "hi"]
    asyncio.run(run())


def test_a_loading_model_is_not_evicted():
    async def run():
        loader = Loader()
        loader.gate = asyncio.Event()
        manager, _, _ = make(max_models=1, loader=loader, room_wait_s=0)
        first = asyncio.ensure_future(answer(manager, "a"))
        await asyncio.sleep(0.01)
        with pytest.raises(APIError) as refused:
            await answer(manager, "b")
        assert refused.value.status == 503
        loader.gate.set()
        assert await first == ["a:", "hi"]
    asyncio.run(run())


def test_a_model_larger_than_the_budget_is_a_503_naming_the_budget():
    async def run():
        needs = {"small": 100 * MIB, "huge": 900 * MIB}
        manager, loader, _ = make(("small", "huge"), needs=needs, budget_bytes=512 * MIB)
        with pytest.raises(APIError) as refused:
            await answer(manager, "huge")
        assert refused.value.status == 503 and refused.value.code == "model_too_large"
        assert "900 MiB" in refused.value.message and "512 MiB" in refused.value.message
        assert loader.loads == []
        assert await answer(manager, "small") == ["small:", "hi"]
    asyncio.run(run())


def test_the_budget_evicts_until_the_new_model_fits():
    async def run():
        clock = Clock()
        needs = {"a": 300 * MIB, "b": 300 * MIB, "c": 300 * MIB}
        manager, _, events = make(needs=needs, max_models=3, budget_bytes=700 * MIB, clock=clock)
        for model_id in ("a", "b", "c"):
            clock.now += 1
            await answer(manager, model_id)
        assert set(manager.loaded()) == {"b", "c"}
        assert ("evicted", "a", "lru") in events
    asyncio.run(run())


def test_a_failed_load_is_a_503_naming_the_cause_and_the_others_keep_serving():
    async def run():
        loader = Loader(broken={"b": "not a GGUF file: bad magic"})
        manager, _, events = make(loader=loader)
        assert await answer(manager, "a") == ["a:", "hi"]
        with pytest.raises(APIError) as failed:
            await answer(manager, "b")
        assert failed.value.status == 503 and failed.value.code == "model_load_failed"
        assert "bad magic" in failed.value.message and "'b'" in failed.value.message
        assert manager.state("b") == "available"  # holds no room: other models load in its place
        assert ("load_failed", "b", "not a GGUF file: bad magic") in events
        assert await answer(manager, "a", "still") == ["a:", "still"]
        assert await answer(manager, "c") == ["c:", "hi"]
    asyncio.run(run())


def test_a_failed_load_is_remembered_for_failed_load_retry_s_then_tried_again():
    """A corrupt file is not read again by every request: within the window its requests get the same 503 at
    once, saying when the replica tries again (and Retry-After); after it, the next request loads again."""
    async def run():
        clock = Clock()
        loader = Loader(broken={"b": "not a GGUF file: bad magic"})
        manager, _, events = make(loader=loader, clock=clock, failed_load_retry_s=30)
        with pytest.raises(APIError) as first:
            await answer(manager, "b")
        assert "again in 30 s" in first.value.message and first.value.headers["Retry-After"] == "30"
        clock.now += 10
        for _ in range(3):
            with pytest.raises(APIError) as again:
                await answer(manager, "b")
            assert again.value.status == 503 and again.value.code == "model_load_failed"
            assert "bad magic" in again.value.message and "failed 10 s ago" in again.value.message
            assert "again in 20 s" in again.value.message and again.value.headers["Retry-After"] == "20"
        assert loader.loads == ["b"]
        assert sum(e[0] == "load_failed" for e in events) == 1
        clock.now += 20
        loader.broken.clear()  # the file was replaced
        assert await answer(manager, "b") == ["b:", "hi"]
        assert loader.loads == ["b", "b"]
        with pytest.raises(APIError):  # a later failure is remembered afresh, not mixed with the old one
            loader.broken["c"] = "out of memory"
            await answer(manager, "c")
        assert await answer(manager, "b", "still") == ["b:", "still"]
    asyncio.run(run())


def test_with_failed_load_retry_s_0_every_request_tries_the_load():
    async def run():
        loader = Loader(broken={"b": "cut short"})
        manager, _, _ = make(loader=loader, failed_load_retry_s=0)
        for _ in range(2):
            with pytest.raises(APIError) as failed:
                await answer(manager, "b")
            assert "cut short" in failed.value.message and "again in" not in failed.value.message
        assert loader.loads == ["b", "b"]
    asyncio.run(run())


def test_requests_waiting_on_a_load_that_fails_all_get_its_503():
    async def run():
        loader = Loader(broken={"b": "cut short"})
        loader.gate = asyncio.Event()
        manager, _, _ = make(loader=loader)
        waiters = [asyncio.ensure_future(answer(manager, "b")) for _ in range(3)]
        await asyncio.sleep(0)
        loader.gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, APIError) and r.status == 503 and "cut short" in r.message for r in results)
        assert loader.loads == ["b"]
    asyncio.run(run())


def test_an_unknown_model_is_a_404():
    async def run():
        manager, _, _ = make()
        with pytest.raises(APIError) as missing:
            await answer(manager, "nope")
        assert missing.value.status == 404 and missing.value.code == "model_not_found"
    asyncio.run(run())


def test_a_job_loads_its_model_and_a_stats_job_never_does():
    """PooledHost.run: any job holds its model (loaded first when cold), as a generation does; asking a
    cold model's stats answers its pool state and leaves it unloaded."""
    async def run():
        manager, loader, _ = make()
        host = PooledHost(manager, "a")
        assert await host.run(StatsJob()) == {"model": "a", "pool": "tail", "pool_state": "available"}
        assert loader.loads == []
        job = TokenizeJob("hi")
        assert await host.run(job, bounded=True) == ("a", job, True)
        assert loader.loads == ["a"]
        assert await host.run(StatsJob()) == {"model": "a", "running": 0, "pool": "tail", "pool_state": "loaded"}
    asyncio.run(run())


def test_a_batch_line_loads_its_model_only_into_room_never_evicting_another():
    async def run():
        from types import SimpleNamespace

        manager, loader, events = make()
        await answer(manager, "a")
        batch_line = SimpleNamespace(batch=True)

        async def batch_answer(model_id: str) -> list:
            out = []
            async for piece in PooledHost(manager, model_id).generate(batch_line):
                out += piece
            return out
        assert (await batch_answer("b"))[0] == "b:"  # room for a second model: loaded
        with pytest.raises(APIError) as refused:  # full: the batch line waits rather than evict a or b
            await batch_answer("c")
        assert refused.value.status == 503 and refused.value.code == "pool_busy_for_batch"
        assert set(manager.loaded()) == {"a", "b"} and not any(e[0] == "evicted" for e in events)
        assert await answer(manager, "c") == ["c:", "hi"]  # an interactive request may evict
    asyncio.run(run())
