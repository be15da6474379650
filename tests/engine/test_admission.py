"""Admission into idle slots: first come, first served, smaller requests backfill slots a larger one
cannot use yet, until that one has waited `backfill_s` (app/engine/admission.py); then on the real
engine, in both directions."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from app.engine import GenerationRequest, SamplingParams
from app.engine.admission import admissible
from app.engine.events import Event, Failed, Finished, Started
from app.prompt.chat_template import render_prompt
from tests.support.events import run_until_idle, wait_idle

pytestmark = pytest.mark.timeout(300)


@dataclass(eq=False)
class Req:
    name: str
    slots_needed: int
    queued_at: float
    tenant: str = ""


def names(taken) -> list[str]:
    return [r.name for r in taken]


def test_first_come_first_served_while_they_fit():
    waiting = [Req("a", 1, 0.0), Req("b", 2, 0.1), Req("c", 1, 0.2)]
    assert names(admissible(waiting, idle=4, now=1.0, backfill_s=1.0)) == ["a", "b", "c"]
    assert names(admissible(waiting, idle=3, now=1.0, backfill_s=1.0)) == ["a", "b"]
    assert admissible(waiting, idle=0, now=1.0, backfill_s=1.0) == []


def test_smaller_requests_backfill_slots_a_blocked_one_cannot_use():
    waiting = [Req("big", 4, 0.0), Req("s1", 1, 0.1), Req("s2", 1, 0.2), Req("s3", 1, 0.3)]
    assert names(admissible(waiting, idle=2, now=0.5, backfill_s=1.0)) == ["s1", "s2"]


def test_no_backfill_once_the_blocked_one_waited_its_bound():
    waiting = [Req("big", 4, 0.0), Req("s1", 1, 0.1)]
    assert admissible(waiting, idle=2, now=1.0, backfill_s=1.0) == []
    assert names(admissible(waiting, idle=4, now=5.0, backfill_s=1.0)) == ["big"]
    # Older requests ahead of it are still served in order.
    waiting = [Req("s0", 1, -1.0), Req("big", 4, 0.0), Req("s1", 1, 0.1)]
    assert names(admissible(waiting, idle=2, now=2.0, backfill_s=1.0)) == ["s0"]


def test_a_second_blocked_request_does_not_stop_backfill_before_the_first_waited_its_bound():
    waiting = [Req("big", 4, 0.0), Req("mid", 3, 0.1), Req("s1", 1, 0.2)]
    assert names(admissible(waiting, idle=2, now=0.5, backfill_s=1.0)) == ["s1"]


def reserved(waiting, idle, holding=(), now=0.5):
    return names(admissible(waiting, idle=idle, now=now, backfill_s=1.0, reserve=1, tenant_of=lambda r: r.tenant,
                            holding=holding))


def test_the_reserved_slot_is_kept_from_keys_that_hold_one_only():
    # A key already running something gets every idle slot but the reserved one, its second request too.
    assert reserved([Req("g1", 1, 0.0, "greedy"), Req("g2", 1, 0.1, "greedy")], idle=2, holding=["greedy"]) == ["g1"]
    assert reserved([Req("g1", 1, 0.0, "greedy"), Req("g2", 1, 0.1, "greedy")], idle=2) == ["g1"]
    # A key holding none takes it, for a request needing every slot too: nothing else would ever free it.
    assert reserved([Req("big", 4, 0.0, "a")], idle=4) == ["big"]
    assert reserved([Req("big", 4, 0.0, "a")], idle=4, holding=["a"]) == []
    # Kept from it alone, a request does not stop the backfill behind it, even past its bound.
    waiting = [Req("g2", 1, 0.0, "greedy"), Req("p1", 1, 0.1, "polite")]
    assert reserved(waiting, idle=1, holding=["greedy"], now=5.0) == ["p1"]
    # Taken by a key holding none, the reserve is gone: nobody else is kept from more.
    waiting = [Req("p1", 1, 0.0, "polite"), Req("g2", 1, 0.1, "greedy")]
    assert reserved(waiting, idle=1, holding=["greedy"]) == ["p1"]


# -- the real engine (4 slots) ------------------------------------------------------------------------

class Log:
    """Every request's events, in the order the engine made them, with their time."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, Event]] = []
        self.lock = threading.Lock()

    def sink(self, name: str):
        def put(event: Event) -> None:
            with self.lock:
                self.events.append((name, time.monotonic(), event))
        return put

    def first(self, name: str, kind: type) -> tuple[int, float] | None:
        with self.lock:
            for i, (n, t, ev) in enumerate(self.events):
                if n == name and isinstance(ev, kind):
                    return i, t
        return None

    def wait(self, name: str, kind: type, timeout: float = 120.0) -> tuple[int, float]:
        deadline = time.monotonic() + timeout
        while (found := self.first(name, kind)) is None:
            assert time.monotonic() < deadline, f"{name}: no {kind.__name__}: {self.events[-5:]}"
            assert self.first(name, Failed) is None, self.events
            time.sleep(0.005)
        return found


def _submit(engine, log: Log, name: str, prompt: str, max_tokens: int, n: int = 1) -> str:
    rid = f"{name}-{uuid.uuid4().hex}"
    req = GenerationRequest(rid, prompt, max_tokens=max_tokens, n=n, sampling=SamplingParams(temperature=0.8, seed=1))
    engine.submit(engine.prepare(req, log.sink(name)))
    return rid


@pytest.fixture
def story(bundled_spec) -> str:
    return render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Write a very long story."}])


def test_a_small_request_is_not_blocked_behind_a_big_one_while_slots_are_free(engine, story, monkeypatch):
    monkeypatch.setattr(engine, "backfill_s", 600.0)
    log = Log()
    long_ids = [_submit(engine, log, f"long{i}", story, 400) for i in range(2)]  # 2 of 4 slots
    for i in range(2):
        log.wait(f"long{i}", Started)
    _submit(engine, log, "big", story, 4, n=4)  # needs all 4 slots
    _submit(engine, log, "small", story, 3)
    end_small, _ = log.wait("small", Finished)
    assert log.first("big", Started) is None  # still waiting for the long ones
    assert log.first("long0", Finished) is None and log.first("long1", Finished) is None
    for rid in long_ids:
        engine.cancel(rid)
    start_big, _ = log.wait("big", Started)
    assert end_small < start_big
    log.wait("big", Finished)
    run_until_idle(engine, wait_idle(engine))


def test_a_big_request_gets_its_slots_once_it_waited_the_bound(engine, story, monkeypatch):
    # The bound is moved rather than waited out, so the test holds however long a step takes here:
    # first far away (a small request behind the big one backfills), then passed (nothing more does).
    monkeypatch.setattr(engine, "backfill_s", 600.0)
    log = Log()
    for i in range(2):
        _submit(engine, log, f"long{i}", story, 40)
    for i in range(2):
        log.wait(f"long{i}", Started)
    _submit(engine, log, "big", story, 4, n=4)
    _submit(engine, log, "early", story, 40)  # within the bound: backfills an idle slot
    log.wait("early", Started)
    monkeypatch.setattr(engine, "backfill_s", 0.0)  # the big one has now waited its bound
    _submit(engine, log, "late", story, 4)  # past the bound: waits behind the big one
    start_big, _ = log.wait("big", Started)
    start_late, _ = log.wait("late", Started)
    assert start_big < start_late
    # The big one started as soon as the generations running at its bound (long0, long1, early) ended:
    # nothing else was admitted in between.
    last_end = max(log.first(name, Finished)[0] for name in ("long0", "long1", "early"))
    assert last_end < start_big
    between = [n for n, _, ev in log.events[last_end:start_big] if isinstance(ev, Started)]
    assert between == [], between
    for name in ("big", "late"):
        log.wait(name, Finished)
    run_until_idle(engine, wait_idle(engine))
