"""The admin side of a pool, with fake engines: a pin keeps a model through LRU pressure, an unpin makes it
evictable, an unload frees it (unpinning it) once its requests end or answers 409 past its bound; and the
admin service (app/pools/admin.py) over two replicas: an unload and a pin reach each, a load lands where it
is routed, the listing shows where each model is, only for models the key may use."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from app.api.errors import APIError
from app.pools.admin import (
    LoadModelRequest, PinModelRequest, PoolAdmin, PoolJob, PoolModelsRequest, UnloadModelRequest,
)
from app.pools.hosted import PooledHost
from app.pools.manager import PoolManager
from app.pools.plan import PoolPlan
from app.tenants.policies import KeyPolicy
from tests.pools.test_pool_manager import Clock, Loader, answer, make


def test_a_pinned_model_survives_lru_pressure_and_an_unpinned_one_does_not():
    async def run():
        clock = Clock()
        manager, loader, events = make(("a", "b", "c", "d"), clock=clock)
        await manager.load("a", pin=True)
        await manager.load("a")  # loading a loaded model: nothing to do
        assert loader.loads == ["a"] and manager.describe()["a"]["pinned"]
        for model_id in ("b", "c", "d", "d"):  # max_models 2: each takes the other free place (d asked as often as a)
            clock.now += 1
            await answer(manager, model_id)
        assert "a" in manager.loaded() and ("evicted", "a", "lru") not in events
        manager.set_pinned("a", False)
        clock.now += 1
        await answer(manager, "b")
        assert "a" not in manager.loaded() and ("evicted", "a", "lru") in events
    asyncio.run(run())


def test_pinning_a_model_not_held_here_pins_nothing():
    async def run():
        manager, _, _ = make()
        manager.set_pinned("b", True)
        assert "b" not in manager.pins and manager.describe() == {}
        with pytest.raises(APIError) as unknown:
            manager.set_pinned("zz", True)
        assert unknown.value.status == 404
    asyncio.run(run())


def test_an_unload_unpins_and_frees_the_model_before_it_answers():
    async def run():
        manager, loader, events = make(pinned=("a",))
        await manager.load("a")
        await manager.unload("a")
        assert loader.engines["a"].closed and manager.state("a") == "available" and "a" not in manager.pins
        assert ("evicted", "a", "admin") in events
        await manager.unload("a")  # not held: nothing to do
    asyncio.run(run())


async def in_use(manager: PoolManager, model_id: str, release: asyncio.Event) -> asyncio.Future:
    """A request holding `model_id` until `release` is set, once it holds it (its load done, its use counted)."""

    async def request():
        async with manager.use(model_id):
            await release.wait()

    running = asyncio.ensure_future(request())
    for _ in range(500):
        entry = manager.entries.get(model_id)
        if entry is not None and entry.active == 1 and entry.host is not None:
            return running
        await asyncio.sleep(0.01)
    raise AssertionError(f"the request never held {model_id!r}")


def test_an_unload_waits_for_the_requests_in_flight_then_unloads():
    async def run():
        manager, loader, _ = make()
        release = asyncio.Event()
        running = await in_use(manager, "a", release)
        unload = asyncio.ensure_future(manager.unload("a", wait_s=5))
        await asyncio.sleep(0.1)
        assert not unload.done() and manager.state("a") == "loaded"  # waits, the request keeps its engine
        release.set()
        await asyncio.wait_for(unload, 2)
        await running
        assert loader.engines["a"].closed and manager.state("a") == "available"
    asyncio.run(run())


def test_an_unload_of_a_model_busy_past_the_bound_is_a_409_and_changes_nothing():
    async def run():
        manager, loader, _ = make(pinned=("a",))
        release = asyncio.Event()
        running = await in_use(manager, "a", release)
        with pytest.raises(APIError) as busy:
            await manager.unload("a", wait_s=0.1)
        assert busy.value.status == 409 and busy.value.code == "model_busy" and "serving 1 request" in busy.value.message
        assert busy.value.headers["Retry-After"]
        assert manager.state("a") == "loaded" and "a" in manager.pins and not loader.engines["a"].closed
        release.set()
        await running
    asyncio.run(run())


def test_loading_a_model_over_the_budget_is_a_503_naming_it():
    async def run():
        manager, _, _ = make(("big",), needs={"big": 300 << 20}, budget_bytes=200 << 20)
        with pytest.raises(APIError) as refused:
            await manager.load("big")
        assert refused.value.status == 503 and refused.value.code == "model_too_large"
        assert "memory budget of 200 MiB" in refused.value.message
    asyncio.run(run())


# ---- the admin service over two replicas -----------------------------------------------------------------

MODELS = ("a", "b", "c", "a:v2")  # a model whose id starts with another's and a colon (Ollama's name:tag)


class Replicas:
    """Two pool replicas (r1, r2), each a PoolManager; a job naming one goes there, any other to `routed`: Serve's
    choice. `gone`: replicas that stopped after being listed."""

    def __init__(self) -> None:
        self.managers = {name: PoolManager(PoolPlan("tail", 2, needs={m: 0 for m in MODELS}), Loader().load,
                                           Loader().unload) for name in ("r1", "r2")}
        self.routed = "r1"
        self.gone: set[str] = set()
        self.jobs: list[tuple[str, PoolJob]] = []

    async def names(self, pool: str) -> list[str]:
        assert pool == "tail"
        return sorted(self.managers)

    async def run(self, model_id: str, job: PoolJob):
        self.jobs.append((model_id, job))
        if job.replica in self.gone:
            raise APIError("gone", status=503, type="server_error", code="replica_gone")
        return await PooledHost(self.managers[job.replica or self.routed], model_id).run(job)


def admin_over(replicas: Replicas) -> PoolAdmin:
    # The admin reads a spec's id and pool only.
    specs = [SimpleNamespace(id=m, pool="tail") for m in MODELS] + [SimpleNamespace(id="own", pool="")]
    return PoolAdmin(specs, replicas.run, replicas.names)


class Caller:
    def __init__(self, policy=None) -> None:
        self.policy = policy


def test_a_load_lands_where_routed_and_the_answer_says_where():
    async def run():
        replicas = Replicas()
        admin = admin_over(replicas)
        card = await admin.load(LoadModelRequest(model="a"), Caller())
        assert card == {"id": "a", "object": "model", "pool": "tail", "state": "loaded", "pinned": False,
                        "replicas": [{"replica": "r1", "state": "loaded", "pinned": False}]}
        again = await admin.load(LoadModelRequest(model="a"), Caller())
        assert again == card
    asyncio.run(run())


def test_an_unload_and_a_pin_reach_every_replica():
    async def run():
        replicas = Replicas()
        admin = admin_over(replicas)
        for name in ("r1", "r2"):
            await replicas.managers[name].load("a")
        pinned = await admin.pin(PinModelRequest(model="a"), Caller())
        assert pinned["pinned"] and [r["pinned"] for r in pinned["replicas"]] == [True, True]
        unpinned = await admin.pin(PinModelRequest(model="a", pinned=False), Caller())
        assert not unpinned["pinned"] and len(unpinned["replicas"]) == 2
        gone = await admin.unload(UnloadModelRequest(model="a"), Caller())
        assert gone["state"] == "available" and gone["replicas"] == []
        assert all(m.state("a") == "available" for m in replicas.managers.values())
    asyncio.run(run())


def test_pinning_a_model_held_nowhere_loads_it_where_routed_and_keeps_it():
    async def run():
        replicas = Replicas()
        replicas.routed = "r2"
        card = await admin_over(replicas).pin(PinModelRequest(model="b"), Caller())
        assert card["replicas"] == [{"replica": "r2", "state": "loaded", "pinned": True}]
        assert "b" in replicas.managers["r2"].pins
    asyncio.run(run())


def test_a_replica_gone_meanwhile_is_left_out():
    async def run():
        replicas = Replicas()
        await replicas.managers["r1"].load("a")
        replicas.gone = {"r2"}
        card = await admin_over(replicas).unload(UnloadModelRequest(model="a"), Caller())
        assert card["state"] == "available"
    asyncio.run(run())


def test_a_model_of_its_own_deployment_is_a_400_and_an_unknown_one_a_404():
    async def run():
        admin = admin_over(Replicas())
        with pytest.raises(APIError) as own:
            await admin.load(LoadModelRequest(model="own"), Caller())
        assert own.value.status == 400 and own.value.code == "model_not_pooled" and own.value.param == "model"
        assert "deployment of its own" in own.value.message
        with pytest.raises(APIError) as unknown:
            await admin.unload(UnloadModelRequest(model="zz"), Caller())
        assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
    asyncio.run(run())


def test_the_listing_shows_where_each_model_is_for_the_models_the_key_may_use():
    async def run():
        replicas = Replicas()
        await replicas.managers["r2"].load("b", pin=True)
        admin = admin_over(replicas)
        listing = await admin.list(PoolModelsRequest(), Caller())
        assert [c["id"] for c in listing["data"]] == ["a", "b", "c", "a:v2"]
        by_id = {c["id"]: c for c in listing["data"]}
        assert by_id["b"]["replicas"] == [{"replica": "r2", "state": "loaded", "pinned": True}]
        assert by_id["a"]["state"] == "available" and by_id["a"]["replicas"] == []
        limited = KeyPolicy(name="t", key_sha256="0" * 64, models=("c",), admin=True)
        assert [c["id"] for c in (await admin.list(PoolModelsRequest(), Caller(limited)))["data"]] == ["c"]
    asyncio.run(run())


def test_an_admin_key_limited_to_a_model_loads_pins_and_unloads_that_model_alone():
    async def run():
        replicas = Replicas()
        admin = admin_over(replicas)
        limited = Caller(KeyPolicy(name="t", key_sha256="0" * 64, models=("a",), admin=True))
        assert (await admin.load(LoadModelRequest(model="a"), limited))["state"] == "loaded"
        for verb, request in ((admin.load, LoadModelRequest(model="a:v2")), (admin.pin, PinModelRequest(model="a:v2")),
                              (admin.unload, UnloadModelRequest(model="a:v2")), (admin.load, LoadModelRequest(model="A")),
                              (admin.load, LoadModelRequest(model="b"))):
            with pytest.raises(APIError) as refused:
                await verb(request, limited)
            assert (refused.value.status, refused.value.code) == (404, "model_not_found"), request
        assert all(job_model == "a" for job_model, _ in replicas.jobs)  # nothing reached a replica for the others
        assert all(m.state("a:v2") == "available" for m in replicas.managers.values())
        listing = await admin.list(PoolModelsRequest(), limited)
        assert [c["id"] for c in listing["data"]] == ["a"]
    asyncio.run(run())
