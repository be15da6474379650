"""Batch lines take only what interactive requests leave (app/engine/admission.py, `batch_share`): the rules alone,
then on the real engine: interactive requests are admitted before batch lines, a running batch line gives its slot
to an interactive request that waits for one (it fails with a retryable `batch_preempted`), and a batch alone takes
every slot. Asserted on admission order and events, never on timing."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import pytest

from app.api.errors import as_api_error
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.admission import BatchShare, InteractiveDemand, batch_share, interactive_first
from app.engine.events import Event, Failed, Finished, Started
from app.prompt.chat_template import render_prompt

pytestmark = pytest.mark.timeout(300)


# -- the rules ---------------------------------------------------------------------------------------------------

def test_batch_lines_take_no_slot_while_an_interactive_request_waits():
    assert batch_share(slots=4, idle=0, running_batch=3, interactive_waiting=2, reserve=1) == BatchShare(0, 2)
    # Idle slots cover part of what interactive requests wait for: only the rest is taken from batch lines.
    assert batch_share(slots=4, idle=1, running_batch=3, interactive_waiting=2, reserve=1) == BatchShare(0, 1)
    # Never more than run.
    assert batch_share(slots=4, idle=0, running_batch=1, interactive_waiting=3, reserve=0) == BatchShare(0, 1)


def test_batch_lines_leave_the_slots_interactive_requests_used_lately():
    assert batch_share(slots=4, idle=4, running_batch=0, interactive_waiting=0, reserve=0) == BatchShare(4, 0)
    assert batch_share(slots=4, idle=2, running_batch=0, interactive_waiting=0, reserve=2) == BatchShare(2, 0)
    assert batch_share(slots=4, idle=3, running_batch=1, interactive_waiting=0, reserve=2) == BatchShare(1, 0)
    # A reserve of every slot still leaves the batch one (nothing may wait on an idle engine).
    assert batch_share(slots=4, idle=4, running_batch=0, interactive_waiting=0, reserve=9) == BatchShare(1, 0)
    assert batch_share(slots=1, idle=1, running_batch=0, interactive_waiting=0, reserve=1) == BatchShare(1, 0)


def test_interactive_demand_keeps_its_peak_for_the_window():
    demand = InteractiveDemand(window_s=10.0)
    assert demand.update(3, now=0.0) == 3
    assert demand.update(1, now=5.0) == 3
    assert demand.update(1, now=10.5) == 1  # the peak is older than the window
    assert demand.update(2, now=11.0) == 2


@dataclass(eq=False)
class Line:
    req: GenerationRequest
    choices: list


def test_interactive_requests_go_before_batch_lines_each_in_its_order():
    def line(name: str, batch: bool) -> Line:
        return Line(GenerationRequest(name, "p", batch=batch), [])

    interactive, batch = interactive_first([line("b0", True), line("i0", False), line("b1", True), line("i1", False)])
    assert [g.req.request_id for g in interactive] == ["i0", "i1"]
    assert [g.req.request_id for g in batch] == ["b0", "b1"]


# -- the real engine ---------------------------------------------------------------------------------------------

class Log:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: set[str] = set()
        self.failed: dict[str, Failed] = {}
        self.lock = threading.Lock()

    def sink(self, name: str):
        def put(event: Event) -> None:
            with self.lock:
                if isinstance(event, Started) and event.index == 0:
                    self.started.append(name)
                elif isinstance(event, Finished):
                    self.finished.add(name)
                elif isinstance(event, Failed):
                    self.failed[name] = event
        return put

    def wait(self, done, what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if done():
                    return
            assert time.monotonic() < deadline, f"no {what}: started {self.started}, failed {self.failed}"
            time.sleep(0.02)


@pytest.fixture
def story(bundled_spec) -> str:
    return render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Write a very long story."}])


def one_thread(spec, **changes):
    return replace(spec, n_threads=1, n_threads_batch=1, **changes)


def submit(engine: LlamaEngine, log: Log, name: str, prompt: str, max_tokens: int, batch: bool) -> str:
    req = GenerationRequest(f"{name}-{time.monotonic_ns()}", prompt, max_tokens=max_tokens, batch=batch,
                            sampling=SamplingParams(temperature=0.0))
    engine.submit(engine.prepare(req, log.sink(name)))
    return req.request_id


def code_of(event: Failed) -> str | None:
    return as_api_error(event.error).code


def test_an_interactive_request_queued_behind_batch_lines_goes_first(bundled_spec, story):
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2))
    try:
        log = Log()
        for i in range(3):
            submit(engine, log, f"b{i}", story, 4, batch=True)
        submit(engine, log, "i0", story, 4, batch=False)  # queued last, before the decode thread starts
        engine.start()
        log.wait(lambda: "i0" in log.finished, "interactive reply")
        assert log.started[0] == "i0"
        log.wait(lambda: len(log.finished) + len(log.failed) == 4, "every line answered")
        # A batch line that found no slot in a second went back to its batch: never another failure.
        assert {code_of(f) for f in log.failed.values()} <= {"batch_deferred"}
    finally:
        engine.close()


def test_a_running_batch_line_gives_its_slot_to_an_interactive_request(bundled_spec, story):
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=2)).start()
    try:
        log = Log()
        ids = {f"b{i}": submit(engine, log, f"b{i}", story, 400, batch=True) for i in range(2)}
        log.wait(lambda: len(log.started) == 2, "both batch lines in a slot")  # a batch alone takes every slot
        submit(engine, log, "i0", story, 4, batch=False)
        log.wait(lambda: "i0" in log.finished, "interactive reply")
        preempted = [name for name, f in log.failed.items() if code_of(f) == "batch_preempted"]
        assert len(preempted) == 1, log.failed
        error = as_api_error(log.failed[preempted[0]].error)
        assert error.status == 503  # what a client (the batch runner) retries
        assert engine.stats()["batch_preempted"] == 1
        for name, request_id in ids.items():  # the other batch line's long reply is not what is tested
            if name not in preempted:
                engine.cancel(request_id)
        deadline = time.monotonic() + 60
        while engine.stats()["running"]:
            assert time.monotonic() < deadline, engine.stats()
            time.sleep(0.02)
    finally:
        engine.close()
