"""Batching properties: a seeded request repeats itself alone after a batched load, and a prompt
that shares a prefix with a busy slot copies that slot's KV."""

from __future__ import annotations

import time

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Finished, Text
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox, assert_same_distribution


def _submit(eng, rid, prompt, max_tokens, cache_prompt=True, logprobs=None, **sampling) -> EventBox:
    box = EventBox()
    eng.submit(eng.prepare(GenerationRequest(request_id=rid, prompt=prompt, max_tokens=max_tokens,
                                             sampling=SamplingParams(**(sampling or {"temperature": 0})),
                                             cache_prompt=cache_prompt, logprobs=logprobs), box))
    return box


def _idle(eng, deadline_s: float = 300) -> None:
    """Wait until nothing runs or waits on the shared engine (another test's generation may still be ending):
    "alone" means alone."""
    end = time.monotonic() + deadline_s
    while (eng.stats()["running"] or eng.stats()["waiting"]) and time.monotonic() < end:
        time.sleep(0.05)
    assert not (eng.stats()["running"] or eng.stats()["waiting"]), eng.stats()


def test_seeded_request_repeats_alone_after_batched_load(engine, bundled_spec):
    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Describe a forest."}])
    # cache_prompt false: each decodes its whole prompt alone, in batches of the same shapes
    seeded = dict(temperature=0.9, top_k=40, top_p=0.95, seed=77, cache_prompt=False)
    _idle(engine)
    first = _submit(engine, "alone-1", prompt, 24, **seeded)
    assert first.wait(300)
    load = [_submit(engine, f"load-{i}", render_prompt(bundled_spec.chat_template, [
        {"role": "user", "content": f"Write about river number {i}."}]), 32, temperature=1.0, seed=i) for i in range(3)]
    batched = _submit(engine, "batched", prompt, 24, **seeded)  # inside the batch (text may differ)
    for box in load + [batched]:
        assert box.wait(300)
    _idle(engine)
    again = _submit(engine, "alone-2", prompt, 24, **seeded)
    assert again.wait(300)
    assert first.text and again.text == first.text


def test_shared_system_prompt_is_copied_from_a_busy_slot(bundled_spec):
    eng = LlamaEngine(bundled_spec).start()
    try:
        system = {"role": "system", "content": "You are a careful assistant. " * 8}
        a = render_prompt(bundled_spec.chat_template, [system, {"role": "user", "content": "Tell a long story."}])
        b = render_prompt(bundled_spec.chat_template, [system, {"role": "user", "content": "Name a color."}])
        shared = 0
        ta, tb = eng.llama.tokenize(a), eng.llama.tokenize(b)
        while ta[shared] == tb[shared]:
            shared += 1
        box_a = _submit(eng, "a", a, 200)
        while not any(isinstance(ev, Text) for ev in box_a.events):  # A is decoding: its slot is busy
            box_a.wait(0.01)
        box_b = _submit(eng, "b", b, 8, logprobs=5)
        assert box_b.wait(60)
        assert box_b.started.cached_tokens == shared > 16
        assert isinstance(box_b.last, Finished) and box_b.last.completion_tokens >= 1
        copied = box_b.logprobs[0]
        eng.cancel("a")  # a cancelled generation sends nothing more: wait for its slot instead
        _idle(eng, 60)
    finally:
        eng.close()
    # The same request on a fresh engine (no reuse): the copied KV gave the first token the distribution a
    # whole prefill gives it.
    fresh = LlamaEngine(bundled_spec).start()
    try:
        box = _submit(fresh, "b2", b, 8, logprobs=5)
        assert box.wait(60)
        assert box.started.cached_tokens == 0
        assert_same_distribution(copied, box.logprobs[0])
    finally:
        fresh.close()
