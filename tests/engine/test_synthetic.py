"""The synthetic engine (capacity planning): the llama.cpp engine's interface and events over a clock,
its step times interpolated from measured figures, and the requests it cannot honour refused clearly."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.config.resolution import resolve_model
from app.config.schema import ModelConfig, SyntheticSettings
from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, Started, Text
from app.engine.stream import generate_stream
from app.engine.synthetic import SyntheticEngine, SyntheticRates
from app.engine.stream import publish_to_loops
from app.engine.errors import EngineError
from tests.support.engine_errors import client_error


@pytest.fixture
def engine():
    spec = resolve_model(ModelConfig(id="syn", engine="synthetic", n_ctx=512, n_seq_max=8, stream_interval_ms=0,
                                     synthetic=SyntheticSettings(step_ms=[(1, 1.0), (8, 2.0)])))
    eng = SyntheticEngine(spec, SyntheticRates(*spec.synthetic), publish_to_loops).start()
    yield eng
    eng.close()


def test_step_times_interpolate_and_extrapolate():
    rates = SyntheticRates(50_000, ((1, 1.36), (16, 6.19), (64, 19.0)))
    assert rates.step_s(1) == pytest.approx(0.00136)
    assert rates.step_s(64) == pytest.approx(0.019)
    assert rates.step_s(40) == pytest.approx((6.19 + (19.0 - 6.19) * 24 / 48) / 1000)
    assert rates.step_s(128) == pytest.approx((19.0 + (19.0 - 6.19) * 64 / 48) / 1000)  # the last slope
    assert 64 / rates.step_s(64) == pytest.approx(3368, rel=0.01)  # the H200 figure it was made from


async def _run(engine, req):
    events = []
    async for batch in generate_stream(engine, req, 0):
        events += batch
    return events


def test_streams_events_like_the_real_engine(engine):
    reqs = [GenerationRequest(f"r{i}", "Hello there", max_tokens=20, sampling=SamplingParams(seed=i))
            for i in range(6)]

    async def main():
        return await asyncio.gather(*(_run(engine, r) for r in reqs))

    for events in asyncio.run(main()):
        assert isinstance(events[0], Started) and events[0].prompt_tokens == len("Hello there") + 1
        texts = [e for e in events if isinstance(e, Text)]
        assert sum(t.tokens for t in texts) == 20 and "".join(t.text for t in texts).strip()
        (end,) = [e for e in events if isinstance(e, Finished)]
        assert (end.finish_reason, end.completion_tokens, end.cached_tokens) == ("length", 20, 0)
    # Six sequences decoded together: about 20 steps, not 120.
    assert 20 <= engine.steps <= 30 and engine.tokens_decoded == 120


def test_stop_sequences_and_choices(engine):
    req = GenerationRequest("s", "x", max_tokens=200, stop=["token "], n=2, sampling=SamplingParams(seed=3))
    events = asyncio.run(_run(engine, req))
    ends = [e for e in events if isinstance(e, Finished)]
    assert sorted(e.index for e in ends) == [0, 1] and all(e.finish_reason == "stop" for e in ends)
    assert "token " not in "".join(e.text for e in events if isinstance(e, Text))


@pytest.mark.parametrize("field,param", [({"logprobs": 2}, "logprobs"), ({"prompt_logprobs": True}, "echo")])
def test_what_it_cannot_do_is_a_400(engine, field, param):
    with client_error() as err:
        engine.prepare(GenerationRequest("x", "hi", max_tokens=4, **field), lambda ev: None)
    assert err.value.status == 400 and err.value.param == param
    with client_error() as err:
        engine.prepare(GenerationRequest("g", "hi", sampling=SamplingParams(grammar='root ::= "a"')), lambda ev: None)
    assert err.value.param == "grammar"


def test_tokenizer_round_trips_any_text(engine):
    text = "Grüße, 🦙 <|im_start|>"
    assert engine.detokenize(engine.tokenize(text, add_special=False)) == text
    with pytest.raises(EngineError):
        engine.detokenize([10**6])


class FakeClock:
    """time.perf_counter and time.sleep of the synthetic engine's module, in a time that only sleeping and
    `work` move: the test asserts on the clock's arithmetic, not on this machine's timing."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


def test_the_work_between_steps_is_part_of_a_step_not_added_to_it(monkeypatch):
    """A step lasts its measured duration with the host's work (making and publishing events) in it, as on
    the GPU it was measured on: 4 ms of work per 5 ms step keeps 5 ms a step; 7 ms of work stretches it."""
    from app.engine import synthetic

    clock = FakeClock()
    monkeypatch.setattr(synthetic, "time", clock)
    spec = resolve_model(ModelConfig(id="syn", engine="synthetic", n_ctx=512, n_seq_max=2, stream_interval_ms=0,
                                     synthetic=SyntheticSettings(prefill_tokens_per_s=1e12, step_ms=[(1, 5.0)])))
    for work_s, step_s in ((0.004, 0.005), (0.007, 0.007)):
        done = threading.Event()
        outputs: list[float] = []

        def publish(items, work_s=work_s, outputs=outputs, done=done):
            outputs.append(clock.now)
            clock.sleep(work_s)   # the host's share of the step
            if any(isinstance(ev, Finished) for _, ev in items):
                done.set()

        eng = SyntheticEngine(spec, SyntheticRates(*spec.synthetic), publish).start()
        try:
            eng.submit(eng.prepare(GenerationRequest("w", "x", max_tokens=20), lambda ev: None))
            assert done.wait(timeout=30)
        finally:
            eng.close()
        decoded = outputs[1:21]   # the first step admits; 20 decode steps follow (then close publishes nothing)
        steps = [b - a for a, b in zip(decoded, decoded[1:])]
        assert steps == pytest.approx([step_s] * 19)


@pytest.mark.parametrize("fair_share", [True, False])
def test_keys_share_the_synthetic_engines_slots_as_the_real_engines(fair_share):
    spec = resolve_model(ModelConfig(id="syn", engine="synthetic", n_ctx=512, n_seq_max=2, stream_interval_ms=0,
                                     fair_share=fair_share, synthetic=SyntheticSettings(step_ms=[(1, 1.0)])))
    eng = SyntheticEngine(spec, SyntheticRates(*spec.synthetic), lambda items: [s(e) for s, e in items])
    started: list[str] = []
    done = threading.Event()

    def sink(name: str):
        def put(event) -> None:
            if isinstance(event, Started):
                started.append(name)
            if isinstance(event, Finished) and len(started) == 6 and name == started[-1]:
                done.set()
        return put

    names = [("a0", "greedy"), ("a1", "greedy"), ("a2", "greedy"), ("a3", "greedy"), ("b0", "polite"),
             ("b1", "polite")]
    for name, tenant in names:  # all queued before the clock starts
        req = GenerationRequest(name, "hi", max_tokens=3, tenant=tenant, weight=2.0,
                                sampling=SamplingParams(seed=1))
        eng.submit(eng.prepare(req, sink(name)))
    eng.start()
    try:
        assert done.wait(30), started
        # With the fair share each key holds one of the two slots; without, the polite key waits behind all.
        assert started == (["a0", "b0", "a1", "b1", "a2", "a3"] if fair_share else [n for n, _ in names])
    finally:
        eng.close()
