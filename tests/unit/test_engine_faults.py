"""A broken llama.cpp context makes the engine report unhealthy and fail its requests cleanly."""

from __future__ import annotations

import threading

import pytest

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
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


def test_a_sequence_llama_cpp_cannot_decode_fails_alone(bundled_spec, monkeypatch):
    # One request whose tokens make llama_decode fail shares a batch with a healthy one: the batch
    # is retried sequence by sequence, the bad request gets a 500, the other one completes.
    eng = LlamaEngine(bundled_spec)
    try:
        real = engine_mod.decode
        poison = eng.mc.tokenize(" zebra", add_special=False)[0]
        seen = {"batches": 0, "alone": 0}

        def failing_on_poison(mc, batch):
            tokens = [batch.raw.token[i] for i in range(batch.n)]
            if poison in tokens:
                seen["batches" if len(set(batch.raw.seq_id[i][0] for i in range(batch.n))) > 1 else "alone"] += 1
                return -1
            return real(mc, batch)

        monkeypatch.setattr(engine_mod, "decode", failing_on_poison)
        boxes = {rid: ([], threading.Event()) for rid in ("bad", "good")}

        def sink(rid):
            box, done = boxes[rid]
            return lambda ev: (box.append(ev), ev[0] in ("end", "error") and done.set())

        with eng._cv:  # both admitted in the same step, so they share the first batch
            eng.submit(eng.prepare(GenerationRequest(request_id="bad", prompt="a zebra", max_tokens=3), sink("bad")))
            eng.submit(eng.prepare(GenerationRequest(request_id="good", prompt="hello", max_tokens=3), sink("good")))
        for box, done in boxes.values():
            assert done.wait(30)
        bad, good = boxes["bad"][0][-1], boxes["good"][0][-1]
        assert bad[0] == "error" and bad[1].status == 500
        assert good[0] == "end" and good[1]["completion_tokens"] == 3
        assert seen == {"batches": 1, "alone": 1}
        assert eng.healthy() and eng.stats()["running"] == 0
    finally:
        eng.close()


def test_a_prefix_the_kv_cache_cannot_cut_is_recomputed(bundled_spec, monkeypatch):
    # Recurrent and hybrid models refuse to cut a sequence at a position (seq_rm returns false):
    # the prefix is recomputed, and the reply is the same as from a cold cache.
    eng = LlamaEngine(bundled_spec)
    try:
        def run(rid):
            box, done = [], threading.Event()
            eng.submit(eng.prepare(GenerationRequest(request_id=rid, prompt="The sea is", max_tokens=6,
                                                     sampling=SamplingParams(temperature=0.0)),
                                   lambda ev: (box.append(ev), ev[0] in ("end", "error") and done.set())))
            assert done.wait(30)
            text = "".join(ev[1] for ev in box if ev[0] == "text")
            return box[0][1]["cached_tokens"], box[-1][0], text

        cold = run("cold")
        assert run("warm")[0] > 0  # normally the prefix is reused
        real_rm = eng.mc.seq_rm
        monkeypatch.setattr(eng.mc, "seq_rm", lambda seq, p0, p1=-1: real_rm(seq, p0, p1) if p0 == 0 else False)
        cached, kind, text = run("recurrent")
        assert (cached, kind, text) == (0, "end", cold[2])
    finally:
        eng.close()
