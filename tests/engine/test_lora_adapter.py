"""LoRA adapters on the real engine (no Ray): adapters written by tools/make_lora.py for the bundled model.

What is guaranteed and asserted: a zero scale is the base model exactly (llama.cpp leaves it out of the
graph); a non-zero scale changes the greedy reply (the adapter's known effect, measured in make_lora.py);
an adapter for another base is refused naming both; KV is never reused across adapter sets; and two
adapters and the base decoding at once each give what they give alone. That last one is exact, not
approximate: the engine decodes one adapter set per step, so a set with one sequence decodes it in batches
of the same shapes as when it is served alone (its prompt whole, then one token per step), in a KV stream
of its own (kv_unified off): the same arithmetic, so the same greedy tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.engine.errors import EngineError
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine import lora
from app.engine.events import Failed, Finished
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox
from tests.support.waiting import wait_for
from tools.make_lora import write_lora
from tests.support.engine_errors import client_error


@pytest.fixture(scope="session")
def lora_files(tmp_path_factory):
    """Adapters made once per session: two seeds for the bundled model and two that fit no SmolLM2."""
    d = tmp_path_factory.mktemp("lora")
    return {"a1": str(write_lora(d / "a1.gguf", seed=1)), "a2": str(write_lora(d / "a2.gguf", seed=2)),
            "wrong-shape": str(write_lora(d / "wrong.gguf", seed=1, wrong_base=True)),
            "wrong-arch": str(write_lora(d / "qwen.gguf", seed=1, arch="qwen2"))}


@pytest.fixture(scope="module")
def lora_engine(bundled_spec, lora_files):
    """An engine of its own (the shared one stays adapter-free), a1 and a2 loaded."""
    eng = LlamaEngine(dataclasses.replace(bundled_spec, kv_unified=False)).start()
    eng.load_adapter("a1", lora_files["a1"])
    eng.load_adapter("a2", lora_files["a2"])
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(bundled_spec):
    return render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Name a fruit."}])


def _request(rid, prompt, adapters=(), max_tokens=16, cache_prompt=False):
    return GenerationRequest(request_id=rid, prompt=prompt, max_tokens=max_tokens, adapters=tuple(adapters),
                             sampling=SamplingParams(temperature=0), cache_prompt=cache_prompt)


def _run(eng, req) -> EventBox:
    box = EventBox()
    eng.submit(eng.prepare(req, box))
    assert box.wait(120), "no reply within 120 s"
    assert isinstance(box.last, Finished), box.last
    return box


def _idle(eng):
    assert wait_for(lambda: not (eng.stats()["running"] or eng.stats()["waiting"]), 120, every=0.05), eng.stats()


def test_a_zero_scale_is_the_base_model_in_llama_cpp(bundled_spec, lora_files, prompt):
    """On a context of its own: llama.cpp with the adapter set at scale 0 gives the base's logits bit for bit
    (so the engine may treat a zero scale as no adapter), and at scale 1 other logits."""
    from app.engine.llama import LlamaModelContext
    import llama_cpp as L

    llama = LlamaModelContext(bundled_spec.path, n_ctx_per_seq=256, n_seq_max=1, n_batch=256, n_threads=2,
                              n_threads_batch=2, n_gpu_layers=0, kv_unified=False)
    adapter = None
    try:
        adapter = lora.load_adapter(llama, lora.BaseTensors.read("smollm2", bundled_spec.path), "a1", lora_files["a1"])
        tokens = llama.tokenize(prompt)

        def logits(aset):
            lora.apply(llama, aset)
            llama.seq_rm(0, 0, -1)
            arr = (L.llama_token * len(tokens))(*tokens)
            assert L.llama_decode(llama.ctx, L.llama_batch_get_one(arr, len(tokens))) == 0
            return np.ctypeslib.as_array(L.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab,)).copy()

        base = logits(lora.BASE)
        assert np.array_equal(logits(lora.AdapterSet(((adapter, 0.0),))), base)  # raw: not normalised away
        assert np.abs(logits(lora.AdapterSet(((adapter, 1.0),))) - base).max() > 1.0
        assert np.array_equal(logits(lora.BASE), base)  # taken off again: the base
    finally:
        lora.apply(llama, lora.BASE)
        if adapter is not None:
            adapter.free()
            adapter.free()  # idempotent: freed once
            assert not adapter.loaded
        llama.close()


def test_scale_zero_gives_the_base_reply_and_a_scale_changes_it(lora_engine, prompt):
    _idle(lora_engine)
    base = _run(lora_engine, _request("base", prompt)).text
    zero = _run(lora_engine, _request("zero", prompt, [("a1", 0.0)])).text
    a1 = _run(lora_engine, _request("a1", prompt, [("a1", 1.0)])).text
    assert base and zero == base
    assert a1 != base
    assert lora.AdapterSet.of([(lora_engine.adapters.loaded["a1"], 0.0)]) == lora.BASE  # batches with the base


def test_two_adapters_and_the_base_at_once_each_give_their_own_reply(lora_engine, prompt):
    sets = {"base": (), "a1": [("a1", 1.0)], "a2": [("a2", 1.0)], "both": [("a1", 0.5), ("a2", 0.5)]}
    _idle(lora_engine)
    alone = {name: _run(lora_engine, _request(f"alone-{name}", prompt, s)).text for name, s in sets.items()}
    assert len(set(alone.values())) == len(sets), alone  # four different models: a mix-up would show
    switches = lora_engine.stats()["adapter_switches"]
    boxes = {name: EventBox() for name in sets}
    gens = [lora_engine.prepare(_request(f"mixed-{name}", prompt, s), boxes[name]) for name, s in sets.items()]
    with lora_engine._cv:  # all queued at once: admitted in one step, decoding together (4 slots)
        for gen in gens:
            lora_engine.submit(gen)
    for name, box in boxes.items():
        assert box.wait(120), name
        assert isinstance(box.last, Finished), box.last
    assert {name: box.text for name, box in boxes.items()} == alone
    # Four sets with 16 tokens each, ADAPTER_TURN_STEPS per turn: the context went round several times.
    assert lora_engine.stats()["adapter_switches"] - switches >= 4


def test_kv_is_reused_only_under_the_same_adapter_set(lora_engine, bundled_spec):
    # A prompt no earlier test decoded: no slot holds its KV under the base yet.
    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Spell the word river."}])
    _idle(lora_engine)
    lora_engine.load_adapter("scoped", lora_engine.adapters.loaded["a1"].path)  # its own KV scope
    try:
        first = _run(lora_engine, _request("a1-first", prompt, [("scoped", 1.0)], cache_prompt=True))
        assert first.started.cached_tokens == 0  # the adapter's first prompt: nothing of its scope yet
        whole = first.started.prompt_tokens - 1  # a reuse keeps all but the last token
        header = len(lora_engine.tokenize(render_prompt(bundled_spec.chat_template, [{"role": "user", "content": ""}])))
        base = _run(lora_engine, _request("base-after", prompt, cache_prompt=True))
        # The adapter's KV of this very prompt is not reused; at most the template's header, which earlier
        # base prompts left in other slots.
        assert base.started.cached_tokens < header < whole
        again = _run(lora_engine, _request("base-again", prompt, cache_prompt=True))
        assert again.started.cached_tokens == whole  # the base's own KV is reused
        adapted = _run(lora_engine, _request("a1-again", prompt, [("scoped", 1.0)], cache_prompt=True))
        assert adapted.started.cached_tokens == whole  # and the adapter's (its slot or the prompt cache kept it)
    finally:
        lora_engine.unload_adapter("scoped")


def test_an_adapter_for_another_base_is_refused_naming_both(lora_engine, lora_files, prompt):
    for kind, says in (("wrong-shape", "does not fit model"), ("wrong-arch", "`qwen2` model")):
        with pytest.raises(lora.AdapterMismatch) as refused:
            lora_engine.load_adapter(kind, lora_files[kind])
        message = str(refused.value)
        assert f"Adapter `{kind}`" in message and lora_files[kind] in message, message
        assert f"model `{lora_engine.spec.id}`" in message and says in message, message
        assert "`llama`" in message, message  # the base's architecture
    assert lora_engine.adapter_names() == ["a1", "a2"]
    assert lora_engine.healthy()
    assert _run(lora_engine, _request("after-refusals", prompt, max_tokens=2)).text


def test_a_file_that_is_no_adapter_is_refused(lora_engine, bundled_spec):
    with pytest.raises(lora.AdapterMismatch, match="is not a LoRA adapter"):
        lora_engine.load_adapter("model-not-adapter", bundled_spec.path)
    assert lora_engine.adapter_names() == ["a1", "a2"]


def test_unknown_adapters_and_bad_scales_are_refused_before_queueing(lora_engine, prompt):
    with client_error() as unknown:
        lora_engine.prepare(_request("unknown", prompt, [("nope", 1.0)]), EventBox())
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
    assert "`nope`" in unknown.value.message and lora_engine.spec.id in unknown.value.message
    for bad in ([("a1", float("nan"))], [("a1", 1.0), ("a1", 0.5)]):
        with client_error() as refused:
            lora_engine.prepare(_request("bad", prompt, bad), EventBox())
        assert refused.value.status == 400 and refused.value.param.startswith("lora["), refused.value


def test_an_unloaded_adapter_is_freed_once_unused_and_then_unknown(lora_engine, lora_files, prompt):
    _idle(lora_engine)
    adapter = lora_engine.load_adapter("brief", lora_files["a2"])
    prepared = lora_engine.prepare(_request("prepared", prompt, [("brief", 1.0)]), EventBox())
    assert lora_engine.unload_adapter("brief") and not lora_engine.unload_adapter("brief")
    with client_error() as gone:  # prepared before the unload, submitted after: refused, not run
        lora_engine.submit(prepared)
    assert gone.value.status == 404
    assert wait_for(lambda: not adapter.loaded, 30, every=0.05), "the unloaded adapter was never freed"
    with pytest.raises(EngineError):
        lora_engine.prepare(_request("after", prompt, [("brief", 1.0)]), EventBox())
    assert "brief" not in lora_engine.adapter_names()
    box = _run(lora_engine, _request("still-serving", prompt, [("a2", 1.0)], max_tokens=2))
    assert not any(isinstance(e, Failed) for e in box.events)
