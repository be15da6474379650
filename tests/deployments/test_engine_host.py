"""The replica's engine host (deployments/engine_host.py) bounds what waits for a slot where no Serve queue
stands in front of it, counting requests still being prepared off the event loop, not only the
engine's own queue. Driven with a stand-in engine that never admits anything (no Ray, no model)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from app.api.errors import APIError  # noqa: E402
from app.engine import GenerationRequest  # noqa: E402
from deployments.engine_host import WAITING_PER_SLOT, EngineHost  # noqa: E402


class StuckEngine:
    """Prepares slowly (on the caller's thread) and never starts what it is given."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.submitted: list = []
        self.cancelled: list[str] = []
        self.active, self.step_s = 0, 0.0

    @property
    def waiting(self) -> int:
        return len(self.submitted) - len(self.cancelled)

    def prepare(self, req, sink):
        self.release.wait(30)
        return SimpleNamespace(req=req)

    def discard(self, gen) -> None:
        pass

    def submit(self, gen) -> None:
        self.submitted.append(gen)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def host_with(engine, kind: str = "chat") -> EngineHost:
    host = object.__new__(EngineHost)  # no Ray replica context: set what generate() reads
    host.spec = SimpleNamespace(id="m", kind=kind, n_seq_max=1, stream_interval_ms=0)
    host.engine, host.unavailable = engine, None
    host.gauges = SimpleNamespace(cache_hit=lambda: None)
    host._gauge_task = object()
    host._unstarted = 0
    return host


def test_requests_being_prepared_count_against_the_waiting_bound():
    engine = StuckEngine()
    host = host_with(engine)

    async def go():
        bound = WAITING_PER_SLOT * host.spec.n_seq_max
        streams = [host.generate(GenerationRequest(f"r{i}", "hi"), bounded=True) for i in range(bound)]
        tasks = [asyncio.ensure_future(anext(s)) for s in streams]
        await asyncio.sleep(0.05)  # all of them are in prepare, none in the engine's queue yet
        assert engine.waiting == 0
        with pytest.raises(APIError) as err:
            await anext(host.generate(GenerationRequest("one-too-many", "hi"), bounded=True))
        assert err.value.status == 503
        engine.release.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.aclose()
        assert host._unstarted == 0

    asyncio.run(go())


def test_embedding_requests_count_against_the_same_bound():
    from concurrent.futures import Future

    from app.engine.embedder import EmbeddingEngine
    from app.engine.params import EmbeddingJob

    class StuckEmbedder(EmbeddingEngine):
        def __init__(self) -> None:  # no model: prepares slowly, never finishes a job
            self.release = threading.Event()

        def prepare(self, job):
            self.release.wait(30)
            return [[1]]

        def submit(self, job, tokens):
            return Future()

    engine = StuckEmbedder()
    host = host_with(engine, kind="embedding")

    async def go():
        bound = WAITING_PER_SLOT * host.spec.n_seq_max
        tasks = [asyncio.ensure_future(host.run(EmbeddingJob(f"r{i}", ("hi",)), bounded=True)) for i in range(bound)]
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as err:
            await host.run(EmbeddingJob("one-too-many", ("hi",)), bounded=True)
        assert err.value.status == 503
        engine.release.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert host._unstarted == 0

    asyncio.run(go())


def test_an_adapter_that_cannot_load_is_a_503_naming_why_while_the_rest_serve():
    """load_adapters: each of the spec's adapters into the engine; one refused (another base, a bad file) is
    reported, and its requests get a 503 saying why, while the base model and the other adapters serve."""
    from app.config.spec import AdapterSpec
    from deployments.engine_host import load_adapters

    class Loader:
        def __init__(self) -> None:
            self.loaded: list[str] = []

        def load_adapter(self, name, path):
            if name == "bad":
                raise ValueError(f"Adapter `{name}` ({path}) was made for a `qwen2` model")
            self.loaded.append(name)

    engine = Loader()
    spec = SimpleNamespace(id="m", adapters=(AdapterSpec("ok", "/a/ok.gguf"), AdapterSpec("bad", "/a/bad.gguf")))
    errors = load_adapters(engine, spec)
    assert engine.loaded == ["ok"] and list(errors) == ["bad"]
    assert "`bad`" in errors["bad"] and "`m`" in errors["bad"] and "qwen2" in errors["bad"]

    host = host_with(StuckEngine())
    host.adapter_errors = errors

    async def first(adapters):
        stream = host.generate(GenerationRequest(request_id="r", prompt="p", adapters=adapters))
        return await anext(stream)

    with pytest.raises(APIError) as info:
        asyncio.run(first((("bad", 1.0),)))
    assert (info.value.status, info.value.code) == (503, "adapter_unavailable") and "qwen2" in info.value.message
