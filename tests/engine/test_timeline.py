"""A generation's timeline (what the vLLM-named metrics and the model spans are read from): the engine's own
measure of the wait for a slot in `Started.queued_s`, and the durations derived per choice."""

from __future__ import annotations

import asyncio

import pytest

from app.api.errors import internal_error
from app.engine.events import Finished, Started, Text
from app.engine.params import GenerationRequest, SamplingParams
from app.engine.stream import generate_stream
from app.engine.timeline import Timeline
from tests.support.events import run_until_idle
from tests.support.grammars import gbnf

# Letters only, more than the generations below may spell: each is cut at max_tokens.
LONG = gbnf("root ::= [a-z ]{200,220}")


async def timed(engine, request: GenerationRequest) -> Timeline:
    timeline = Timeline()
    async for batch in generate_stream(engine, request, 0.0):
        timeline.feed(batch)
    timeline.close()
    return timeline


def request(i: int, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(request_id=f"t{i}", prompt=f"Story number {i}:", max_tokens=max_tokens,
                             sampling=SamplingParams(seed=i, grammar=LONG))


def test_one_generation_durations_add_up(engine):
    (c,) = run_until_idle(engine, timed(engine, request(0, 6))).stats()
    assert (c.generation_tokens, c.finish_reason) == (6, "length")
    assert c.prompt_tokens > 0 and 0 <= c.cached_tokens < c.prompt_tokens
    assert 0 <= c.queue_s < c.e2e_s
    assert 0 < c.prefill_s <= c.ttft_s and 0 < c.decode_s <= c.inference_s <= c.e2e_s
    assert c.ttft_s + c.decode_s == pytest.approx(c.e2e_s)
    assert c.prefill_s + c.decode_s == pytest.approx(c.inference_s)
    assert c.tpot_s == pytest.approx(c.decode_s / 5)


def test_queue_time_is_the_wait_for_a_slot(engine):
    slots = engine.stats()["slots"]

    async def go():
        # one more than the slots: the last waits until a slot frees
        return await asyncio.gather(*(timed(engine, request(i, 12)) for i in range(slots + 1)))

    stats = [t.stats()[0] for t in run_until_idle(engine, go())]
    assert all(s.finish_reason == "length" and s.generation_tokens == 12 for s in stats)
    queued = sorted(stats, key=lambda s: s.queue_s)
    waited, first = queued[-1], queued[:-1]
    # the one that waited was admitted once another had finished: about one generation later
    assert waited.queue_s >= 0.5 * min(s.inference_s for s in first)
    assert all(s.queue_s < waited.queue_s / 2 for s in first)
    assert waited.e2e_s >= waited.queue_s + waited.inference_s - 0.05


def test_choices_that_did_not_finish():
    cancelled = Timeline()
    cancelled.feed([Started(prompt_tokens=4, cached_tokens=1, queued_s=0.25), Started(4, 1, index=1, queued_s=0.25)])
    cancelled.feed([Text("a", 1), Text("b", 2, index=1)])
    cancelled.feed([Finished("stop", 4, 1, 1)])
    cancelled.close(GeneratorExit())
    done, left = cancelled.stats()
    assert (done.finish_reason, done.generation_tokens, done.queue_s) == ("stop", 1, 0.25)
    assert (left.finish_reason, left.generation_tokens, left.tpot_s) == ("abort", 2, left.decode_s)

    failed = Timeline()
    failed.feed([Started(prompt_tokens=4, cached_tokens=0)])
    failed.close(internal_error("boom"))
    (c,) = failed.stats()
    assert c.finish_reason == "error" and c.ttft_s is None and c.decode_s is None and c.tpot_s is None

    never = Timeline()  # refused before the engine admitted it: no request to count
    never.close(internal_error("bad"))
    assert never.stats() == []
