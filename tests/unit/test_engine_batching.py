"""Batching properties: a seeded request repeats itself alone after a batched load, and a prompt
that shares a prefix with a busy slot copies that slot's KV."""

from __future__ import annotations

import threading

from app.chat_template import render_prompt
from app.engine import GenerationRequest, LlamaEngine, SamplingParams


def _submit(eng, rid, prompt, max_tokens, **sampling):
    done, box = threading.Event(), []

    def sink(ev):
        box.append(ev)
        if ev[0] in ("end", "error"):
            done.set()

    eng.submit(eng.prepare(GenerationRequest(request_id=rid, prompt=prompt, max_tokens=max_tokens,
                                             sampling=SamplingParams(**(sampling or {"temperature": 0}))), sink))
    return done, box


def _text(box):
    return "".join(ev[1] for ev in box if ev[0] == "text")


def test_seeded_request_repeats_alone_after_batched_load(engine, bundled_spec):
    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Describe a forest."}])
    seeded = dict(temperature=0.9, top_k=40, top_p=0.95, seed=77)
    done, first = _submit(engine, "alone-1", prompt, 24, **seeded)
    assert done.wait(60)
    load = [_submit(engine, f"load-{i}", render_prompt(bundled_spec.chat_template, [
        {"role": "user", "content": f"Write about river number {i}."}]), 32, temperature=1.0, seed=i) for i in range(3)]
    done_b, batched = _submit(engine, "batched", prompt, 24, **seeded)  # inside the batch (text may differ)
    for d, _ in load + [(done_b, batched)]:
        assert d.wait(120)
    done, again = _submit(engine, "alone-2", prompt, 24, **seeded)
    assert done.wait(60)
    assert _text(first) and _text(again) == _text(first)


def test_shared_system_prompt_is_copied_from_a_busy_slot(bundled_spec):
    eng = LlamaEngine(bundled_spec)
    try:
        system = {"role": "system", "content": "You are a careful assistant. " * 8}
        a = render_prompt(bundled_spec.chat_template, [system, {"role": "user", "content": "Tell a long story."}])
        b = render_prompt(bundled_spec.chat_template, [system, {"role": "user", "content": "Name a color."}])
        shared = 0
        ta, tb = eng.mc.tokenize(a), eng.mc.tokenize(b)
        while ta[shared] == tb[shared]:
            shared += 1
        done_a, box_a = _submit(eng, "a", a, 200)
        while not any(ev[0] == "text" for ev in box_a):  # A is decoding: its slot is busy
            done_a.wait(0.01)
        done_b, box_b = _submit(eng, "b", b, 8)
        assert done_b.wait(60)
        start = next(ev for ev in box_b if ev[0] == "start")[1]
        assert start["cached_tokens"] == shared > 16
        assert box_b[-1][0] == "end" and box_b[-1][1]["completion_tokens"] >= 1
        text_b = "".join(ev[1] for ev in box_b if ev[0] == "text")
        eng.cancel("a")
        done_a.wait(10)
    finally:
        eng.close()
    # The same request on a fresh engine (no reuse) gives the same greedy text.
    fresh = LlamaEngine(bundled_spec)
    try:
        done, box = _submit(fresh, "b2", b, 8)
        assert done.wait(60)
        assert next(ev for ev in box if ev[0] == "start")[1]["cached_tokens"] == 0
        assert "".join(ev[1] for ev in box if ev[0] == "text") == text_b
    finally:
        fresh.close()
