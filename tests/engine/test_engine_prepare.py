"""A request's slow setup happens before it is queued and away from the engine's lock: `prepare` runs off
the event loop, builds each choice's sampler chain (a grammar parsed there is the request's 400), and
refuses a prompt whose size alone proves it cannot fit before tokenizing it. The decode thread places
admitted requests (KV copies, prompt-cache saves and restores) without holding the lock that
`submit`, `cancel` and `stats` take."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from app.engine.errors import EngineError
from app.engine import GenerationRequest, SamplingParams
from app.engine import engine as engine_mod
from app.engine.events import Finished
from app.engine.stream import generate_stream
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox, run_until_idle, wait_idle
from tests.support.grammars import gbnf
from tests.support.engine_errors import client_error

pytestmark = pytest.mark.timeout(300)

GRAMMAR = gbnf('root ::= "yes" | "no"')


def _prompt(spec, text: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": text}])


def _request(prompt: str, max_tokens: int | None = 4, n: int = 1, **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=uuid.uuid4().hex, prompt=prompt, max_tokens=max_tokens, n=n,
                             sampling=SamplingParams(**sampling))


async def _collect(engine, req: GenerationRequest) -> list:
    return [ev async for batch in generate_stream(engine, req, 0) for ev in batch]


def test_generate_stream_prepares_off_the_event_loop(engine, bundled_spec, monkeypatch):
    threads = []
    real = engine.prepare

    def recording(req, sink):
        threads.append(threading.current_thread())
        return real(req, sink)

    monkeypatch.setattr(engine, "prepare", recording)

    async def go():
        events = await _collect(engine, _request(_prompt(bundled_spec, "Say hi."), 2, temperature=0))
        return threading.current_thread(), events

    loop_thread, events = run_until_idle(engine, go())
    assert isinstance(events[-1], Finished)
    assert threads and all(t is not loop_thread for t in threads)


def test_sampler_chains_are_built_in_prepare_never_on_the_decode_thread(engine, bundled_spec, monkeypatch):
    built_on = []
    real = engine_mod.SamplerChain

    def recording(llama, params, *args, **kwargs):
        built_on.append(threading.current_thread().name)
        return real(llama, params, *args, **kwargs)

    monkeypatch.setattr(engine_mod, "SamplerChain", recording)
    box = EventBox(3)
    gen = engine.prepare(_request(_prompt(bundled_spec, "Yes or no?"), 4, n=3, grammar=GRAMMAR), box)
    assert all(g.sampler is not None and g.sampler.chain for g in (gen, *gen.choices))
    engine.submit(gen)
    assert box.wait(120) and isinstance(box.last, Finished)
    run_until_idle(engine, wait_idle(engine))
    assert built_on and not any(name.startswith("llama-engine") for name in built_on), built_on
    assert all(g.sampler is None for g in (gen, *gen.choices))  # freed as each choice ended


def test_a_malformed_grammar_is_refused_before_anything_is_queued(engine, bundled_spec):
    with client_error() as err:
        engine.prepare(_request(_prompt(bundled_spec, "hi"), 4, n=2, grammar='root ::= ("a"'), EventBox())
    assert (err.value.status, err.value.param, err.value.code) == (400, "grammar", "invalid_grammar")
    assert engine.stats()["waiting"] == 0


def test_a_request_cancelled_before_admission_frees_its_samplers(engine, bundled_spec):
    story = _prompt(bundled_spec, "Write a very long story about a dragon who loves bread.")
    busy = [f"busy-{i}-{uuid.uuid4().hex}" for i in range(4)]
    for rid in busy:  # every slot taken
        engine.submit(engine.prepare(GenerationRequest(rid, story, max_tokens=400), EventBox()))
    waiting = engine.prepare(_request(story, 4, n=2, grammar=GRAMMAR), EventBox(2))
    chains = [g.sampler for g in (waiting, *waiting.choices)]
    assert all(c is not None and c.chain for c in chains)
    engine.submit(waiting)
    engine.cancel(waiting.request_id)
    deadline = time.monotonic() + 60
    while engine.stats()["waiting"]:
        assert time.monotonic() < deadline, engine.stats()
        time.sleep(0.005)
    assert all(c.chain is None for c in chains)
    for rid in busy:
        engine.cancel(rid)
    run_until_idle(engine, wait_idle(engine))


def test_a_prepared_request_that_is_never_submitted_is_discarded(engine, bundled_spec):
    """Its stream gave up while `prepare` ran (on the preparation pool): what it prepared is freed, never queued."""
    started = threading.Event()
    real_prepare = engine.prepare

    def slow_prepare(req, sink):
        started.set()
        time.sleep(0.2)  # still preparing when the stream is cancelled
        return real_prepare(req, sink)

    async def go():
        stream = generate_stream(engine, _request(_prompt(bundled_spec, "hi"), 4, grammar=GRAMMAR), 0)
        first = asyncio.ensure_future(anext(stream))
        await asyncio.to_thread(started.wait, 10)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await stream.aclose()

    freed = []
    real = engine.discard
    engine.discard = lambda gen: (freed.append(gen), real(gen))
    engine.prepare = slow_prepare
    try:
        run_until_idle(engine, go())
        deadline = time.monotonic() + 30
        while not freed:  # the preparing thread finishes after the stream gave up
            assert time.monotonic() < deadline, "never discarded"
            time.sleep(0.01)
    finally:
        del engine.discard
        del engine.prepare
    assert freed and freed[0].sampler is None
    assert engine.stats()["waiting"] == 0


def test_placement_never_holds_the_lock_that_stats_and_submit_take(engine, bundled_spec, monkeypatch):
    answered = []
    real = engine.placement.place

    def slow_place(*args, **kwargs):
        # While this placement runs on the decode thread, another thread asks for stats.
        t = threading.Thread(target=lambda: answered.append(engine.stats()), daemon=True)
        t.start()
        t.join(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.placement, "place", slow_place)
    box = EventBox()
    engine.submit(engine.prepare(_request(_prompt(bundled_spec, "Say hi."), 2, temperature=0), box))
    assert box.wait(120)
    assert isinstance(box.last, Finished)
    assert answered, "stats() waited for the placement"


# -- a prompt too long to fit, known from its size ---------------------------------------------------

TEXTS = ["hello " * 300, "x" * 2000, "日本語のテキスト" * 100, "<|im_start|>user\n" * 50, " " * 3000,
         "\n\n\n\n" * 200, "=" * 1000 + "-" * 1000, "The quick brown fox. " * 100]


@pytest.mark.parametrize("text", TEXTS)
def test_the_size_bound_never_exceeds_the_token_count(engine, text):
    longest = engine.llama.longest_piece
    assert longest and longest >= 1
    n_bytes = len(text.encode())
    assert -(-n_bytes // longest) <= len(engine.llama.tokenize_prompt(text))


def test_a_prompt_whose_size_proves_it_too_long_is_refused_without_tokenizing(engine, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(engine.llama, "tokenize_prompt", no_tokenizing)
    huge = "word " * (1 << 20)  # 5 MiB
    t0 = time.perf_counter()
    with client_error() as err:
        engine.prepare(_request(huge, None), EventBox())
    assert time.perf_counter() - t0 < 1.0
    e = err.value
    assert (e.status, e.param, e.code) == (400, "messages", "context_length_exceeded")
    assert "1024" in e.message and "at least" in e.message
    # prompt plus completion: the same
    with client_error() as err:
        engine.prepare(_request("w" * (1000 * engine.llama.longest_piece), 200), EventBox())
    assert err.value.code == "context_length_exceeded"
    assert engine.stats()["waiting"] == 0


def test_a_prompt_near_the_limit_is_still_tokenized_and_counted(engine):
    # Its size does not prove it too long: the exact count decides.
    text = "hello " * 900
    n = len(engine.llama.tokenize_prompt(text))
    assert n < 1024
    gen = engine.prepare(_request(text, 1024 - n), EventBox())
    engine.discard(gen)
    assert len(gen.prompt) == n and gen.sampler is None


# -- logprob entries, within the request's share --------------------------------------------------

def _lp_request(prompt: str, max_tokens: int | None, logprobs: int | None, share: int | None, n: int = 1,
                echo: bool = False) -> GenerationRequest:
    return GenerationRequest(uuid.uuid4().hex, prompt, max_tokens=max_tokens, n=n, logprobs=logprobs,
                             prompt_logprobs=echo, max_logprob_entries=share)


def test_logprob_entries_past_the_share_are_a_400_naming_the_limit(engine):
    text = "The quick brown fox jumps over the lazy dog. " * 10
    n = len(engine.tokenize(text))
    # exactly at the share: fine (scored prompt x 6 + 10 generated x 2 choices x 6)
    exact = (n + 10 * 2) * 6
    engine.discard(engine.prepare(_lp_request(text, 10, 5, exact, n=2, echo=True), EventBox()))
    with client_error() as err:
        engine.prepare(_lp_request(text, 10, 5, exact - 1, n=2, echo=True), EventBox())
    e = err.value
    assert (e.status, e.param, e.code) == (400, "logprobs", "logprobs_too_large")
    assert "max_logprob_entries" in e.message and str(exact) in e.message
    # without a max_tokens, the context left is what may be generated
    with pytest.raises(EngineError):
        engine.prepare(_lp_request(text, None, 0, 1024 - n - 1), EventBox())
    engine.discard(engine.prepare(_lp_request(text, None, 0, 1024 - n), EventBox()))
    # no logprobs asked: no bound
    engine.discard(engine.prepare(_lp_request(text, 10, None, 1), EventBox()))
    assert engine.stats()["waiting"] == 0


def test_a_long_scored_prompt_past_the_share_is_refused_without_tokenizing(engine, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(engine.llama, "tokenize_prompt", no_tokenizing)
    prompt = "x" * (engine.llama.longest_piece * 200)  # at least 200 tokens, within the context
    with client_error() as err:
        engine.prepare(_lp_request(prompt, 0, 20, 65536 // 128, echo=True), EventBox())
    assert err.value.code == "logprobs_too_large" and "at least" in err.value.message
