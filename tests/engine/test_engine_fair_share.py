"""The fair share of a real engine's slots between keys (app/engine/admission.py `in_share_order`): a key
with a backlog waits behind one that holds fewer slots, each key's own requests stay first come first
served, and weights share the slots in proportion. Asserted on the order the engine admits requests (its
`Started` events, made in admission order), never on timing."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.admission import RecentTenants
from app.engine.events import Event, Failed, Finished, Started
from app.prompt.chat_template import render_prompt

pytestmark = pytest.mark.timeout(300)


class Admissions:
    """The names of the requests in the order the engine admitted them, and which have finished."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: set[str] = set()
        self.failed: list[Event] = []
        self.lock = threading.Lock()

    def sink(self, name: str):
        def put(event: Event) -> None:
            with self.lock:
                if isinstance(event, Started):
                    self.started.append(name)
                elif isinstance(event, Finished):
                    self.finished.add(name)
                elif isinstance(event, Failed):
                    self.failed.append(event)
        return put

    def wait(self, done, what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                assert not self.failed, self.failed
                if done():
                    return
            assert time.monotonic() < deadline, f"no {what}: started {self.started}, finished {self.finished}"
            time.sleep(0.02)


def request(name: str, tenant: str, weight: float, prompt: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(f"{name}-{time.monotonic_ns()}", prompt, max_tokens=max_tokens, tenant=tenant,
                             weight=weight, sampling=SamplingParams(temperature=0.0))


def submit(engine: LlamaEngine, log: Admissions, name: str, tenant: str, weight: float, prompt: str,
           max_tokens: int) -> None:
    engine.submit(engine.prepare(request(name, tenant, weight, prompt, max_tokens), log.sink(name)))


def one_thread(spec, **changes):
    """One decode thread: the order asserted is the same, and a busy machine slows it less (two threads wait
    for each other at every step)."""
    return replace(spec, n_threads=1, n_threads_batch=1, **changes)


@pytest.fixture
def story(bundled_spec) -> str:
    return render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Write a very long story."}])


@pytest.mark.parametrize("fair_share", [True, False])
def test_a_key_that_comes_later_takes_the_next_slot_ahead_of_a_backlog(bundled_spec, story, fair_share):
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2, fair_share=fair_share))
    try:
        log = Admissions()
        polite = engine.prepare(request("b", "polite", 2.0, story, 2), log.sink("b"))
        arrive = log.sink("a1")

        def a1_then_b(event: Event) -> None:
            arrive(event)
            if isinstance(event, Started):  # on the engine thread: b comes while a0 and a1 hold both slots
                engine.submit(polite)

        greedy = [f"a{i}" for i in range(4)]
        for name in greedy:
            # a1 outlives a0: when a0's slot frees, the greedy key still holds one (freed together, both keys
            # would hold none, and the older request, a2, would rightly go first)
            engine.submit(engine.prepare(request(name, "greedy", 2.0, story, 12 if name == "a1" else 4),
                                         a1_then_b if name == "a1" else log.sink(name)))
        engine.start()  # all four queued: a0 and a1 take the slots, a2 and a3 wait, then b comes
        log.wait(lambda: len(log.finished) == 5, "all finished")
        if fair_share:
            assert log.started == ["a0", "a1", "b", *greedy[2:]]
        else:  # first come, first served: behind the whole backlog
            assert log.started == [*greedy, "b"]
    finally:
        engine.close()


@pytest.mark.parametrize("fair_share", [True, False])
def test_a_high_priority_key_gets_twice_the_slots_of_a_normal_one(bundled_spec, story, fair_share):
    # Three slots: the share 4:2 gives `high` two and `normal` one whenever both have a backlog.
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=3, fair_share=fair_share))
    try:
        log = Admissions()
        # All queued before the decode thread starts: both keys backlogged from the first admission on,
        # `high` first in arrival.
        for i in range(6):
            submit(engine, log, f"h{i}", "team-high", 4.0, story, 4)
        for i in range(6):
            submit(engine, log, f"n{i}", "team-normal", 2.0, story, 4)
        engine.start()
        log.wait(lambda: len(log.finished) == 12, "all finished")
        first_six = log.started[:6]
        highs = [n for n in log.started if n.startswith("h")]
        assert highs == [f"h{i}" for i in range(6)]  # first come, first served within a key
        if fair_share:
            assert sum(n.startswith("h") for n in first_six) == 4, log.started
            assert log.started[:3] == ["h0", "n0", "h1"]
        else:
            assert first_six == highs
    finally:
        engine.close()


def test_one_key_is_served_first_come_first_served(bundled_spec, story):
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2))
    try:
        log = Admissions()
        names = [f"r{i}" for i in range(4)]
        for name in names:
            submit(engine, log, name, "", 1.0, story, 4)  # a server without keys: every tenant is ""
        engine.start()
        log.wait(lambda: len(log.finished) == 4, "all finished")
        assert log.started == names
    finally:
        engine.close()


def test_a_slot_is_held_back_for_a_key_that_used_the_model_lately(bundled_spec, story):
    # Two slots; `polite` used the model a moment ago and has nothing running: `greedy` gets one slot, not
    # both, so polite's next request starts at the next step instead of after a whole greedy generation.
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2))
    try:
        log = Admissions()
        engine.start()
        submit(engine, log, "p0", "polite", 2.0, story, 1)
        log.wait(lambda: "p0" in log.finished, "polite's first request")
        for i in range(3):  # long, and with the end-of-text tokens banned: g0 outlasts p1 even on a stalled machine
            gen = replace(request(f"g{i}", "greedy", 2.0, story, 96),
                          sampling=SamplingParams(temperature=0.0, logit_bias=[(t, -100.0) for t in (0, 1, 2)]))
            engine.submit(engine.prepare(gen, log.sink(f"g{i}")))
        log.wait(lambda: log.started[-1:] == ["g0"], "greedy's first request")
        assert engine.stats()["running"] == 1  # the other slot is held back, g1 and g2 wait
        submit(engine, log, "p1", "polite", 2.0, story, 1)
        log.wait(lambda: "p1" in log.finished, "polite's second request")
        assert log.started[:3] == ["p0", "g0", "p1"] and "g0" not in log.finished  # at once, beside g0
        log.wait(lambda: len(log.finished) == 5, "all finished")
    finally:
        engine.close()


def test_a_request_for_every_slot_is_not_kept_waiting_for_an_idle_key(bundled_spec, story):
    # `polite` used the model a moment ago and the held-back slot would stay its for the whole window (an hour
    # here): a request for both slots from a key running nothing still starts, on a model otherwise idle.
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2))
    engine._recent = RecentTenants(window_s=3600.0)
    try:
        log = Admissions()
        engine.start()
        submit(engine, log, "p0", "polite", 2.0, story, 1)
        log.wait(lambda: "p0" in log.finished, "polite's request")
        both = replace(request("g", "greedy", 2.0, story, 2), n=2)
        engine.submit(engine.prepare(both, log.sink("g")))
        log.wait(lambda: "g" in log.finished, "the request for both slots", timeout=60.0)
        assert log.started == ["p0", "g", "g"]
    finally:
        engine.close()
