"""The real llama.cpp engine (bundled SmolLM2-135M, n_ctx=1024, 4 slots), driven without Ray.

Every test runs its coroutine through `run()`, which waits for the engine to go idle before the
event loop closes: the engine thread delivers events with loop.call_soon_threadsafe, and a
closed loop there would take the shared engine down for every later test.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from app.prompt.chat_template import render_prompt
from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Event, Failed, Finished, Started, Text
from app.engine.stream import generate_stream
from app.api.errors import as_api_error
from app.engine.errors import ContextExceeded, bad_input
from tests.support.events import assert_same_distribution, run_until_idle as run
from tests.support.grammars import gbnf
from tests.support.engine_errors import client_error

# A hung engine must fail the test, not stall the run (pytest-timeout; generous for busy CPUs).
pytestmark = pytest.mark.timeout(300)

GREEDY = {"temperature": 0.0}
THINK_GRAMMAR = gbnf('root ::= "<think>" [a-z ]{1,40} "</think>" [a-z ]{1,40}')


@dataclass
class Result:
    events: list[Event]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Text))

    @property
    def start(self) -> Started:
        starts = [e for e in self.events if isinstance(e, Started)]
        assert len(starts) == 1, self.events
        assert self.events[0] is starts[0], "start must be the first event"
        return starts[0]

    @property
    def end(self) -> Finished:
        ends = [e for e in self.events if isinstance(e, Finished)]
        assert len(ends) == 1, self.events
        assert self.events[-1] is ends[0], "end must be the last event"
        return ends[0]

    @property
    def logprobs(self) -> list:
        return [lp for e in self.events if isinstance(e, Text) for lp in e.logprobs]

    @property
    def text_tokens(self) -> int:
        return sum(e.tokens for e in self.events if isinstance(e, Text))


def prompt_for(spec, text: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": text}])


def request(prompt: str, max_tokens: int | None = 8, stop: list[str] | None = None, cache_prompt: bool = True,
            logprobs: int | None = None, **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=uuid.uuid4().hex, prompt=prompt, max_tokens=max_tokens, stop=stop or [],
                             sampling=SamplingParams(**sampling), cache_prompt=cache_prompt, logprobs=logprobs)


async def generate(engine, req: GenerationRequest) -> Result:
    events: list[dict[str, Any]] = []
    stream = generate_stream(engine, req, 0)
    try:
        async for batch in stream:
            assert isinstance(batch, list)
            events.extend(batch)
    finally:
        await stream.aclose()
    return Result(events)


@pytest.fixture(scope="module")
def story(bundled_spec) -> str:
    return prompt_for(bundled_spec, "Write a very long story about a dragon who loves bread.")


@pytest.fixture(scope="module")
def short(bundled_spec) -> str:
    return prompt_for(bundled_spec, "Tell me about cats.")


@pytest.fixture(autouse=True)
def healthy_engine(engine):
    assert engine.healthy(), engine.broken
    yield
    assert engine.healthy(), engine.broken
    s = engine.stats()
    assert s["running"] == 0 and s["waiting"] == 0, s


# ---- determinism -------------------------------------------------------------------------------

# What the engine guarantees: identical seeded requests that reuse no cached prefix (cache_prompt false)
# and run alone decode in batches of the same shapes, so they agree. With a prefix reused, the prompt's
# last token is decoded in a batch of another shape and the sums may differ in their last bits.

def test_same_seed_same_text(engine, short):
    params = dict(temperature=0.9, top_p=0.95, top_k=40, seed=1234, cache_prompt=False)
    a = run(engine, generate(engine, request(short, 16, **params)))
    b = run(engine, generate(engine, request(short, 16, **params)))
    assert a.text and a.text == b.text
    assert a.end.completion_tokens == b.end.completion_tokens


def test_different_seeds_differ(engine, short):
    texts = {run(engine, generate(engine, request(short, 16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                                  seed=s))).text for s in (1, 2, 3)}
    assert len(texts) >= 2


def test_greedy_is_deterministic(engine, short):
    a = run(engine, generate(engine, request(short, 12, **GREEDY, cache_prompt=False)))
    b = run(engine, generate(engine, request(short, 12, **GREEDY, seed=99, cache_prompt=False)))  # any seed
    assert a.text and a.text == b.text


# ---- counting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7])
def test_max_tokens_gives_length_and_exact_count(engine, story, n):
    r = run(engine, generate(engine, request(story, n, **GREEDY)))
    assert r.end.finish_reason == "length"
    assert r.end.completion_tokens == n
    assert r.text_tokens == n
    assert r.text


def test_prompt_tokens_match_tokenizer(engine, story):
    r = run(engine, generate(engine, request(story, 2, **GREEDY)))
    expected = len(engine.llama.tokenize(story))
    assert expected > 20
    assert r.start.prompt_tokens == expected
    assert r.end.prompt_tokens == expected


def test_stop_string_is_cut_and_finishes_stop(engine, story):
    full = run(engine, generate(engine, request(story, 24, cache_prompt=False, **GREEDY))).text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert len(stop) == 3
    expected = full[: full.find(stop)]
    r = run(engine, generate(engine, request(story, 24, stop=[stop], cache_prompt=False, **GREEDY)))
    assert r.text == expected
    assert stop not in r.text
    assert r.end.finish_reason == "stop"
    assert r.end.completion_tokens < 24


def test_stop_never_matching_changes_nothing(engine, story):
    a = run(engine, generate(engine, request(story, 10, cache_prompt=False, **GREEDY)))
    b = run(engine, generate(engine, request(story, 10, stop=["\x00NEVER"], cache_prompt=False, **GREEDY)))
    assert a.text == b.text
    assert b.end.finish_reason == "length"


# ---- limits ------------------------------------------------------------------------------------

def _recording_sink():
    calls = []
    return calls, calls.append


def test_prompt_longer_than_context_rejected_by_prepare(engine):
    calls, sink = _recording_sink()
    long_prompt = "hello " * 1100
    before = engine.stats()
    with client_error() as info:
        engine.prepare(request(long_prompt, None), sink)
    err = info.value
    assert err.status == 400
    assert err.code == "context_length_exceeded"
    assert err.param == "messages"
    assert "1024" in err.message
    assert str(len(engine.llama.tokenize(long_prompt))) in err.message
    assert calls == []
    after = engine.stats()
    assert after["waiting"] == 0 and after["running"] == 0
    assert after["steps"] == before["steps"]


def test_prompt_plus_max_tokens_over_context(engine, short):
    calls, sink = _recording_sink()
    n = len(engine.llama.tokenize(short))
    with client_error() as info:
        engine.prepare(request(short, 1024 - n + 1), sink)
    assert info.value.status == 400
    assert info.value.code == "context_length_exceeded"
    assert f"{n} in the messages, {1024 - n + 1} in the completion" in info.value.message
    # exactly at the limit is fine (prepared, never submitted)
    seq = engine.prepare(request(short, 1024 - n), sink)
    assert seq.max_tokens == 1024 - n
    assert calls == []
    assert engine.stats()["waiting"] == 0


def test_context_error_through_generate_stream(engine):
    async def go():
        with client_error() as info:
            await generate(engine, request("word " * 1100, 4))
        return info.value
    err = run(engine, go())
    assert err.code == "context_length_exceeded"


# ---- grammar -----------------------------------------------------------------------------------

@pytest.mark.parametrize("grammar", ['root ::= ("a"', "nonsense", 'other ::= "x"'])
def test_malformed_grammar_is_400_and_engine_keeps_serving(engine, short, grammar):
    async def go():
        with client_error() as info:
            await generate(engine, request(short, 4, grammar=grammar))
        return info.value
    err = run(engine, go())
    assert err.status == 400
    assert err.param == "grammar"
    assert err.code == "invalid_grammar"
    assert engine.stats()["waiting"] == 0
    nxt = run(engine, generate(engine, request(short, 3, **GREEDY)))
    assert nxt.end.finish_reason == "length" and nxt.end.completion_tokens == 3


def test_grammar_forces_output(engine, short):
    r = run(engine, generate(engine, request(short, 120, grammar=THINK_GRAMMAR, temperature=0.8, seed=2)))
    assert re.fullmatch(r"<think>[a-z ]{1,40}</think>[a-z ]{1,40}", r.text), r.text
    assert r.end.finish_reason == "stop"


# ---- concurrency and cancellation --------------------------------------------------------------

def test_four_concurrent_requests(engine, bundled_spec):
    topics = ["dragons", "the sea", "a robot", "winter"]
    limits = [12, 17, 22, 27]
    prompts = [prompt_for(bundled_spec, f"Write a very long story about {t}.") for t in topics]

    async def go():
        peak = 0
        done = asyncio.Event()

        async def watch():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, engine.stats()["running"])
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        try:
            results = await asyncio.gather(*[generate(engine, request(p, n, temperature=0.7, seed=i))
                                             for i, (p, n) in enumerate(zip(prompts, limits))])
        finally:
            done.set()
            await watcher
        return results, peak

    results, peak = run(engine, go())
    assert peak == 4, "the four requests should be decoded together"
    for r, p, n in zip(results, prompts, limits):
        assert r.start.prompt_tokens == len(engine.llama.tokenize(p))
        assert r.end.finish_reason == "length"
        assert r.end.completion_tokens == n
        assert r.text_tokens == n


def test_more_requests_than_slots_queue_and_complete(engine, story):
    async def go():
        return await asyncio.gather(*[generate(engine, request(story, 4 + i, temperature=0.8, seed=i))
                                      for i in range(6)])
    results = run(engine, go())
    assert [r.end.completion_tokens for r in results] == [4, 5, 6, 7, 8, 9]
    assert all(r.end.finish_reason == "length" for r in results)


async def _wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.002)


def _overloaded() -> bool:
    """Other test runs share these CPUs; llama.cpp's spinning threads then slow a step to seconds."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def test_cancelled_request_frees_its_slot(engine, story, short):
    async def go():
        stream = generate_stream(engine, request(story, 500, **GREEDY), 0)
        got_text = False
        async for batch in stream:
            if any(isinstance(e, Text) and e.text for e in batch):
                got_text = True
                break
        assert got_text
        assert engine.stats()["running"] == 1
        steps_at_cancel = engine.stats()["steps"]
        t0 = time.monotonic()
        await stream.aclose()
        await _wait_for(lambda: engine.stats()["running"] == 0, f"slot not freed: {engine.stats()}")
        elapsed = time.monotonic() - t0
        # freed at the next step boundary, long before its 500 tokens
        assert engine.stats()["steps"] - steps_at_cancel <= 3, engine.stats()
        if not _overloaded():
            assert elapsed < 2.0
        follow = await generate(engine, request(short, 3, **GREEDY))
        return follow

    follow = run(engine, go())
    assert follow.end.finish_reason == "length"
    assert follow.end.completion_tokens == 3


def test_cancel_while_waiting(engine, story):
    async def go():
        # fill all slots, then queue one more and cancel it before it is admitted
        running = [asyncio.create_task(generate(engine, request(story, 24, temperature=0.8, seed=i)))
                   for i in range(4)]
        await _wait_for(lambda: engine.stats()["running"] == 4, f"4 not admitted: {engine.stats()}")
        steps_full = engine.stats()["steps"]
        stream = generate_stream(engine, request(story, 24, **GREEDY), 0)
        first = asyncio.ensure_future(stream.__anext__())
        # prepared in a thread, then submitted, in the first step of the generator
        await _wait_for(lambda: engine.stats()["waiting"] == 1, f"not queued: {engine.stats()}")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await _wait_for(lambda: engine.stats()["waiting"] == 0, f"not dropped: {engine.stats()}")
        # dropped from the queue while all four slots were still busy: it never ran
        assert engine.stats()["steps"] - steps_full < 20
        assert not any(t.done() for t in running)
        assert engine.stats()["running"] == 4
        await stream.aclose()
        return await asyncio.gather(*running)

    results = run(engine, go())
    assert [r.end.completion_tokens for r in results] == [24, 24, 24, 24]


# ---- KV prefix reuse ---------------------------------------------------------------------------

def test_prefix_reuse(engine, bundled_spec):
    prompt = prompt_for(bundled_spec, "List some facts about the planet Mars, please.")
    first = run(engine, generate(engine, request(prompt, 12, cache_prompt=False, logprobs=5, **GREEDY)))
    second = run(engine, generate(engine, request(prompt, 12, logprobs=5, **GREEDY)))
    n = first.start.prompt_tokens
    assert second.start.prompt_tokens == n
    assert first.start.cached_tokens == 0
    assert second.start.cached_tokens == n - 1  # all but the last prompt token
    assert second.end.cached_tokens == n - 1
    # The reused KV gives the first token the distribution the whole prefill gave it.
    assert_same_distribution(first.logprobs[0], second.logprobs[0])


def test_prefix_reuse_with_extended_prompt(engine, bundled_spec):
    base = [{"role": "user", "content": "Name a fruit."}]
    p1 = render_prompt(bundled_spec.chat_template, base)
    r1 = run(engine, generate(engine, request(p1, 6, **GREEDY)))
    p2 = render_prompt(bundled_spec.chat_template, base + [{"role": "assistant", "content": r1.text},
                                                          {"role": "user", "content": "Another one."}])
    r2 = run(engine, generate(engine, request(p2, 6, **GREEDY)))
    assert r2.start.cached_tokens >= len(engine.llama.tokenize(p1)) - 1
    assert r2.end.completion_tokens <= 6


# ---- sampler options ---------------------------------------------------------------------------

def test_penalties_and_truncation_samplers_accepted(engine, story):
    params = dict(temperature=0.7, repeat_penalty=1.3, presence_penalty=1.0, frequency_penalty=0.5,
                  top_k=5, min_p=0.1, top_p=0.9, seed=3)
    a = run(engine, generate(engine, request(story, 20, cache_prompt=False, **params)))
    b = run(engine, generate(engine, request(story, 20, cache_prompt=False, **params)))
    assert a.end.finish_reason == "length" and a.end.completion_tokens == 20
    assert a.text == b.text
    assert engine.healthy()


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                     {"repeat_penalty": 1.8}])
def test_penalties_change_greedy_output(engine, short, penalty):
    plain = run(engine, generate(engine, request(short, 40, **GREEDY)))
    penalised = run(engine, generate(engine, request(short, 40, **GREEDY, **penalty)))
    assert penalised.end.completion_tokens >= 1
    assert penalised.text != plain.text


def test_top_k_one_is_greedy(engine, short):
    greedy = run(engine, generate(engine, request(short, 10, cache_prompt=False, **GREEDY)))
    topk1 = run(engine, generate(engine, request(short, 10, temperature=1.5, top_k=1, seed=7, cache_prompt=False)))
    assert topk1.text == greedy.text


# ---- small pieces ------------------------------------------------------------------------------

def test_resolved_seed_is_32_bit_and_never_random_marker():
    assert SamplingParams(seed=5).resolved_seed() == 5
    assert SamplingParams(seed=0xFFFFFFFF).resolved_seed() != 0xFFFFFFFF
    assert SamplingParams(seed=-1).resolved_seed() != 0xFFFFFFFF
    assert 0 <= SamplingParams(seed=2**64 - 1).resolved_seed() < 0xFFFFFFFF
    assert 0 <= SamplingParams().resolved_seed() < 2**31


def test_generation_request_and_events_cross_a_ray_hop_as_they_are():
    # Ray pickles what crosses a handle: the dataclasses must come back equal, typed.
    req = request("p", 5, stop=["x"], temperature=0.1, grammar="root ::= \"a\"", logit_bias=[(3, 1.5)])
    again = pickle.loads(pickle.dumps(req))
    assert again == req and isinstance(again.sampling, SamplingParams)
    for event in (Started(3, 1), Text("a", 1), Finished("stop", 3, 1, 1)):
        assert pickle.loads(pickle.dumps(event)) == event
    failed = pickle.loads(pickle.dumps(Failed(bad_input("x", "grammar", "c"))))
    assert isinstance(failed, Failed) and (failed.error.kind, failed.error.subject, failed.error.code) == (
        "bad_input", "grammar", "c")
    api = as_api_error(pickle.loads(pickle.dumps(Failed(ContextExceeded(64, 60, 10)))).error)
    assert (api.status, api.param, api.code) == (400, "messages", "context_length_exceeded")
    assert api.message == as_api_error(ContextExceeded(64, 60, 10)).message


# ---- logit_bias --------------------------------------------------------------------------------

def test_logit_bias_forces_and_bans_tokens(engine, short):
    banana = engine.llama.tokenize(" banana", add_special=False)[0]
    forced = run(engine, generate(engine, request(short, max_tokens=3, temperature=0.0,
                                                  logit_bias=[(banana, 100.0)])))
    assert forced.text == " banana" * 3
    plain = run(engine, generate(engine, request(short, max_tokens=4, temperature=0.0)))
    first = engine.llama.tokenize(plain.text, add_special=False)[0]
    banned = run(engine, generate(engine, request(short, max_tokens=4, temperature=0.0,
                                                  logit_bias=[(first, -100.0)])))
    assert engine.llama.tokenize(banned.text, add_special=False)[0] != first


# ---- grammars no token can satisfy -------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_no_token_satisfies_fails_the_request_not_the_engine(engine, short, temperature):
    # llama.cpp parses this grammar, but its only character class excludes every character: without
    # the check, llama.cpp throws through its C API (std::terminate) and the replica dies.
    with client_error() as err:
        run(engine, generate(engine, request(short, max_tokens=4, temperature=temperature,
                                             grammar=gbnf("root ::= [^\\x00-\\U0010FFFF]"))))
    assert err.value.status == 400 and err.value.code == "grammar_unsatisfiable"
    ok = run(engine, generate(engine, request(short, max_tokens=8, temperature=temperature,
                                              grammar=gbnf('root ::= "yes" | "no"'))))
    assert ok.text in ("yes", "no") and ok.end.finish_reason == "stop"
