"""bench.engine's closed loop: n requests in flight, the next submitted as one ends, every token counted."""

from __future__ import annotations

import threading

from app.engine.events import Finished
from bench.engine import closed_loop


class FakeEngine:
    """Finishes each generation from a thread of its own (as the engine's decode thread calls sinks),
    and records how many were in flight at once."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.lock = threading.Lock()
        self.running = self.most = self.submitted = 0

    def prepare(self, req, sink):
        return req, sink

    def submit(self, prepared) -> None:
        req, sink = prepared
        with self.lock:
            self.running += 1
            self.submitted += 1
            self.most = max(self.most, self.running)

        def finish() -> None:
            with self.lock:
                self.running -= 1
            sink(Finished(finish_reason="length", prompt_tokens=5, completion_tokens=self.tokens, cached_tokens=0))
        threading.Timer(0.005, finish).start()


def test_keeps_n_in_flight_and_counts_every_token():
    engine = FakeEngine(tokens=7)
    rate = closed_loop(engine, "{{ messages[0].content }}", n=3, requests=12, max_tokens=7, first=0)
    assert engine.submitted == 12
    assert engine.most == 3
    assert rate > 0


def test_fewer_requests_than_streams():
    engine = FakeEngine(tokens=2)
    closed_loop(engine, "{{ messages[0].content }}", n=16, requests=4, max_tokens=2, first=0)
    assert engine.submitted == 4 and engine.most == 4
