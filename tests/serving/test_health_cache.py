"""/health's cache: at most one refresh per interval however many probes, the last states kept when a
refresh fails, and the body each caller sees."""

import asyncio

from app.serving.health import HealthCache, health_body
from app.serving.models import LOADING, READY, ModelState


def test_a_flood_of_reads_costs_one_refresh_per_interval():
    calls = []

    async def refresh():
        calls.append(1)
        await asyncio.sleep(0.01)
        return {"m": READY}

    async def main():
        cache = HealthCache(refresh, ["m"], interval_s=60)
        states = await asyncio.gather(*(cache.get() for _ in range(500)))
        assert all(s == {"m": READY} for s in states)

    asyncio.run(main())
    assert len(calls) == 1


def test_a_failed_refresh_keeps_the_last_states_and_a_slow_first_one_reads_as_loading():
    results = [{"m": READY}, RuntimeError("controller gone")]

    async def refresh():
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    async def main():
        cache = HealthCache(refresh, ["m"], interval_s=0)
        assert await cache.get() == {"m": READY}
        await cache.get()  # starts the failing refresh
        await asyncio.sleep(0.01)
        assert await cache.get() == {"m": READY}

        async def stuck():
            await asyncio.sleep(10)

        slow = HealthCache(stuck, ["m"], first_wait_s=0.05)
        assert await slow.get() == {"m": LOADING}

    asyncio.run(main())


def test_body_hides_reasons_unless_detailed():
    states = {"a": READY, "b": ModelState("unavailable", "self-check failed: SIGILL (AVX-512 build)")}
    status, public = health_body(states, ["a", "b"], detailed=False)
    assert status == 503 and public == {"status": "unavailable"}
    status, detailed = health_body(states, ["a", "b"], detailed=True)
    assert detailed["errors"] == {"b": "self-check failed: SIGILL (AVX-512 build)"}
    assert detailed["models"] == {"a": True, "b": False}
    assert health_body({"a": READY}, ["a", "b"], detailed=False) == (503, {"status": "loading"})
