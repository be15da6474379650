"""n choices from one decode of the prompt, logprobs of generated tokens, and scored prompts."""

from __future__ import annotations

import math


from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, PromptLogprobs, Started, Text
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox, run_until_idle, wait_idle
from tests.support.engine_errors import client_error


def _run(engine, req: GenerationRequest) -> EventBox:
    box = EventBox(req.n)
    engine.submit(engine.prepare(req, box))
    assert box.wait(120), box.events
    run_until_idle(engine, wait_idle(engine))
    return box


def _prompt(spec, text: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": text}])


def test_n_choices_share_one_decode_of_the_prompt(engine, bundled_spec):
    prompt = _prompt(bundled_spec, "Write one sentence about the sea and the wind over it. " * 4)
    before = engine.tokens_decoded
    req = GenerationRequest("n3", prompt, max_tokens=12, n=3, sampling=SamplingParams(temperature=1.0, seed=11))
    box = _run(engine, req)
    n_prompt = box.started.prompt_tokens
    finished = [box.of(Finished, i)[0] for i in range(3)]
    assert [len(box.of(Started, i)) for i in range(3)] == [1, 1, 1]
    assert all(f.prompt_tokens == n_prompt for f in finished)
    generated = sum(f.completion_tokens for f in finished)
    # The prompt (less what the cache already held) is decoded once, not three times; each choice's
    # last sampled token is never decoded.
    decoded = engine.tokens_decoded - before
    assert decoded <= n_prompt - box.started.cached_tokens + generated, (decoded, n_prompt, generated)
    texts = [box.text_of(i) for i in range(3)]
    assert all(texts) and len(set(texts)) > 1  # seeds differ per choice
    # Each choice is reproducible (twice from the cached prompt: a cold prompt is computed in
    # other batch shapes, so its logits differ in the last bits).
    runs = [_run(engine, GenerationRequest(f"n3-{k}", prompt, max_tokens=12, n=3,
                                           sampling=SamplingParams(temperature=1.0, seed=11))) for k in range(2)]
    assert [runs[0].text_of(i) for i in range(3)] == [runs[1].text_of(i) for i in range(3)]


def test_greedy_choices_agree(engine, bundled_spec):
    box = _run(engine, GenerationRequest("g2", _prompt(bundled_spec, "Name a fruit."), max_tokens=8, n=2,
                                         sampling=SamplingParams(temperature=0)))
    assert box.text_of(0) and box.text_of(0) == box.text_of(1)


def test_more_choices_than_slots_is_a_400(engine, bundled_spec):
    with client_error() as err:
        engine.prepare(GenerationRequest("big", "hi", max_tokens=4, n=bundled_spec.n_seq_max + 1), EventBox())
    assert err.value.status == 400 and err.value.param == "n"


def test_logprobs_describe_the_sampled_tokens(engine, bundled_spec):
    box = _run(engine, GenerationRequest("lp", _prompt(bundled_spec, "Count to five."), max_tokens=10, logprobs=5,
                                         sampling=SamplingParams(temperature=0.8, seed=3)))
    entries = [lp for ev in box.of(Text) for lp in ev.logprobs]
    finished = box.of(Finished)[0]
    # One entry per token of text: an end-of-generation token is counted but has no text.
    assert len(entries) == finished.completion_tokens - (finished.finish_reason == "stop")
    assert b"".join(e.token for e in entries).decode() == box.text
    for e in entries:
        values = [v for _, v in e.top]
        assert len(e.top) == 5 and values == sorted(values, reverse=True)
        assert all(v <= 0 for v in values) and sum(math.exp(v) for v in values) <= 1 + 1e-6
        assert e.logprob <= values[0] + 1e-9
        if e.token in dict(e.top):
            assert math.isclose(dict(e.top)[e.token], e.logprob, abs_tol=1e-9)


def test_greedy_tokens_are_the_most_likely(engine, bundled_spec):
    box = _run(engine, GenerationRequest("lp0", _prompt(bundled_spec, "Say hello."), max_tokens=6, logprobs=1,
                                         sampling=SamplingParams(temperature=0)))
    entries = [lp for ev in box.of(Text) for lp in ev.logprobs]
    assert entries and all(e.top[0][0] == e.token for e in entries)


def test_scored_prompt_agrees_with_generation(engine):
    # The prompt's last token scored in context equals its logprob when generated after the rest.
    gen = _run(engine, GenerationRequest("p1", "The capital of France is", max_tokens=1, logprobs=0,
                                         sampling=SamplingParams(temperature=0)))
    first = gen.of(Text)[0].logprobs[0]
    scored = _run(engine, GenerationRequest("p2", "The capital of France is" + first.token.decode(), max_tokens=0,
                                            logprobs=2, prompt_logprobs=True))
    assert [type(e) for e in scored.events] == [Started, PromptLogprobs, Finished]
    entries = scored.of(PromptLogprobs)[0].entries
    assert len(entries) == scored.started.prompt_tokens
    assert entries[0].logprob is None and all(e.logprob is not None for e in entries[1:])
    assert entries[-1].token == first.token and math.isclose(entries[-1].logprob, first.logprob, abs_tol=1e-3)
    assert scored.of(Finished)[0].finish_reason == "length" and scored.of(Finished)[0].completion_tokens == 0


def test_cancelled_choices_free_every_slot(engine, bundled_spec):
    box = EventBox(3)
    engine.submit(engine.prepare(GenerationRequest("cx", _prompt(bundled_spec, "Tell a very long story."),
                                                   max_tokens=400, n=3), box))
    while sum(isinstance(e, Text) for e in box.events) < 3:
        box.wait(0.01)
    engine.cancel("cx")
    run_until_idle(engine, wait_idle(engine))
    assert engine.stats()["running"] == 0
