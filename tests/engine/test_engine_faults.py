"""A broken llama.cpp context makes the engine report unhealthy and fail its requests cleanly."""

from __future__ import annotations


from app.api.errors import as_api_error
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine import engine as engine_mod
from app.engine.events import Failed, Finished
from tests.support.events import EventBox
from tests.support.engine_errors import client_error


def test_decode_crash_marks_engine_unhealthy_and_fails_requests(bundled_spec, monkeypatch):
    eng = LlamaEngine(bundled_spec).start()
    try:
        assert eng.healthy()

        def broken(*args, **kwargs):
            raise RuntimeError("ggml: device lost")

        monkeypatch.setattr(engine_mod, "decode", broken)
        box = EventBox()
        eng.submit(eng.prepare(GenerationRequest(request_id="r1", prompt="hello", max_tokens=4), box))
        assert box.wait(10)
        assert isinstance(box.last, Failed) and as_api_error(box.last.error).status == 503
        assert not eng.healthy() and "device lost" in eng.broken
        with client_error() as info:  # nothing new is accepted by a dead engine
            eng.submit(eng.prepare(GenerationRequest(request_id="r2", prompt="hello", max_tokens=4), box))
        assert info.value.status == 503
    finally:
        eng.close()


def test_a_sequence_llama_cpp_cannot_decode_fails_alone(bundled_spec, monkeypatch):
    # One request whose tokens make llama_decode fail shares a batch with a healthy one: the batch
    # is retried sequence by sequence, the bad request gets a 500, the other one completes.
    eng = LlamaEngine(bundled_spec).start()
    try:
        real = engine_mod.decode
        poison = eng.llama.tokenize(" zebra", add_special=False)[0]
        seen = {"batches": 0, "alone": 0}

        def failing_on_poison(llama, batch):
            tokens = [batch.raw.token[i] for i in range(batch.n)]
            if poison in tokens:
                seen["batches" if len(set(batch.raw.seq_id[i][0] for i in range(batch.n))) > 1 else "alone"] += 1
                return -1
            return real(llama, batch)

        monkeypatch.setattr(engine_mod, "decode", failing_on_poison)
        bad, good = EventBox(), EventBox()
        with eng._cv:  # both admitted in the same step, so they share the first batch
            eng.submit(eng.prepare(GenerationRequest(request_id="bad", prompt="a zebra", max_tokens=3), bad))
            eng.submit(eng.prepare(GenerationRequest(request_id="good", prompt="hello", max_tokens=3), good))
        assert bad.wait(30) and good.wait(30)
        assert isinstance(bad.last, Failed) and as_api_error(bad.last.error).status == 500
        assert isinstance(good.last, Finished) and good.last.completion_tokens == 3
        assert seen == {"batches": 1, "alone": 1}
        assert eng.healthy() and eng.stats()["running"] == 0
    finally:
        eng.close()


def test_a_prefix_the_kv_cache_cannot_cut_is_recomputed(bundled_spec, monkeypatch):
    # Recurrent and hybrid models refuse to cut a sequence at a position (seq_rm returns false):
    # the prefix is recomputed, and the reply is the same as from a cold cache.
    eng = LlamaEngine(bundled_spec).start()
    try:
        def run(rid):
            box = EventBox()
            eng.submit(eng.prepare(GenerationRequest(request_id=rid, prompt="The sea is", max_tokens=6,
                                                     sampling=SamplingParams(temperature=0.0)), box))
            assert box.wait(30)
            return box.started.cached_tokens, type(box.last).__name__, box.text

        cold = run("cold")
        assert run("warm")[0] > 0  # normally the prefix is reused
        real_rm = eng.llama.seq_rm
        monkeypatch.setattr(eng.llama, "seq_rm", lambda seq, p0, p1=-1: real_rm(seq, p0, p1) if p0 == 0 else False)
        cached, kind, text = run("recurrent")
        assert (cached, kind, text) == (0, "Finished", cold[2])
    finally:
        eng.close()
