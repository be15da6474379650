"""bench.engine's closed loop: n requests in flight, the next submitted as one ends, every token counted."""

from __future__ import annotations

import threading
import time

import pytest

from app.engine.events import Finished
from bench.engine import closed_loop


class FakeEngine:
    """A busy engine on a thread of its own (it calls the sinks, as the decode thread does): once `slots` are in
    flight, or the last request came, it finishes the oldest every few milliseconds. Records how many were in
    flight at once: a loop that submits more than its n without waiting for ends takes it past n."""

    STEP_S = 0.005

    def __init__(self, tokens: int, slots: int, total: int) -> None:
        self.tokens, self.slots, self.total = tokens, slots, total
        self.changed = threading.Condition()
        self.held: list = []
        self.most = self.submitted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def prepare(self, req, sink):
        return req, sink

    def submit(self, prepared) -> None:
        with self.changed:
            self.held.append(prepared[1])
            self.submitted += 1
            self.most = max(self.most, len(self.held))
            self.changed.notify()

    def _run(self) -> None:
        done = Finished(finish_reason="length", prompt_tokens=5, completion_tokens=self.tokens, cached_tokens=0)
        for _ in range(self.total):
            with self.changed:
                self.changed.wait_for(lambda: self.held and (len(self.held) >= self.slots
                                                             or self.submitted == self.total))
            time.sleep(self.STEP_S)
            with self.changed:
                sink = self.held.pop(0)
            sink(done)


@pytest.mark.timeout(30)  # a loop that keeps fewer than n in flight never fills the fake engine
def test_keeps_n_in_flight_and_counts_every_token(monkeypatch):
    clock = iter([100.0, 102.0])  # the loop's start and end: 2 s
    monkeypatch.setattr("bench.engine.time.perf_counter", lambda: next(clock))
    engine = FakeEngine(tokens=7, slots=3, total=12)
    rate = closed_loop(engine, "{{ messages[0].content }}", n=3, requests=12, max_tokens=7, first=0)
    assert engine.submitted == 12
    assert engine.most == 3
    assert rate == 12 * 7 / 2


@pytest.mark.timeout(30)
def test_fewer_requests_than_streams():
    engine = FakeEngine(tokens=2, slots=16, total=4)
    closed_loop(engine, "{{ messages[0].content }}", n=16, requests=4, max_tokens=2, first=0)
    assert engine.submitted == 4 and engine.most == 4
