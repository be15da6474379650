"""A broken llama.cpp context makes the engine report unhealthy and fail its requests cleanly."""

from __future__ import annotations

import threading

import pytest

from app.engine import GenerationRequest, LlamaEngine
from app.engine import engine as engine_mod
from app.errors import APIError


def test_decode_crash_marks_engine_unhealthy_and_fails_requests(bundled_spec, monkeypatch):
    eng = LlamaEngine(bundled_spec)
    try:
        assert eng.healthy()

        def broken(*args, **kwargs):
            raise RuntimeError("ggml: device lost")

        monkeypatch.setattr(engine_mod, "decode", broken)
        events, done = [], threading.Event()

        def sink(ev):
            events.append(ev)
            if ev[0] in ("end", "error"):
                done.set()

        eng.submit(eng.prepare(GenerationRequest(request_id="r1", prompt="hello", max_tokens=4), sink))
        assert done.wait(10)
        assert events[-1][0] == "error" and isinstance(events[-1][1], APIError) and events[-1][1].status == 503
        assert not eng.healthy() and "device lost" in eng.broken
        with pytest.raises(APIError) as info:  # nothing new is accepted by a dead engine
            eng.submit(eng.prepare(GenerationRequest(request_id="r2", prompt="hello", max_tokens=4), sink))
        assert info.value.status == 503
    finally:
        eng.close()


def test_decode_error_code_fails_only_that_batch(bundled_spec, monkeypatch):
    eng = LlamaEngine(bundled_spec)
    try:
        real = engine_mod.decode
        calls = {"n": 0}

        def flaky(mc, batch):
            calls["n"] += 1
            return -1 if calls["n"] == 1 else real(mc, batch)

        monkeypatch.setattr(engine_mod, "decode", flaky)
        results = []
        for rid in ("a", "b"):
            done = threading.Event()
            box = []
            eng.submit(eng.prepare(GenerationRequest(request_id=rid, prompt="hello", max_tokens=3),
                                   lambda ev, box=box, done=done: (box.append(ev), ev[0] in ("end", "error") and done.set())))
            assert done.wait(30)
            results.append(box[-1])
        assert results[0][0] == "error" and results[0][1].status == 500
        assert results[1][0] == "end" and results[1][1]["completion_tokens"] == 3
        assert eng.healthy() and eng.stats()["running"] == 0
    finally:
        eng.close()
