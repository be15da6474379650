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
from app.engine.batch_rows import PROMPT_SLOWDOWN, SLOWDOWN, STARVED_STEPS, batch_row_budget
from app.engine.step_times import StepTimes
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


# -- rows in a step (app/engine/batch_rows.py, step_times.py) ---------------------------------------------------

def cpu_like(per_row_s: float = 0.003, fixed_s: float = 0.003) -> StepTimes:
    """Step times of a CPU: every row costs about as much as the next."""
    times = StepTimes()
    for rows in (1, 2, 4, 8, 16, 32, 64, 128):
        times.observe(rows, fixed_s + per_row_s * rows)
    return times


def gpu_like() -> StepTimes:
    """Step times of a GPU at small batches: rows nearly free."""
    times = StepTimes()
    for rows in (1, 2, 4, 8, 16, 32, 64, 128):
        times.observe(rows, 0.010 + 0.00001 * rows)
    return times


def test_step_times_are_read_between_the_measured_sizes():
    times = cpu_like()
    assert times.seconds(4) == pytest.approx(0.015)
    assert times.seconds(6) == pytest.approx(0.021)  # between the buckets of 4 and 8
    assert times.seconds(300) == pytest.approx(0.903)  # the last slope beyond the largest
    assert StepTimes().seconds(4) is None
    one = StepTimes()
    one.observe(10, 0.1)
    assert one.seconds(20) == pytest.approx(0.2)  # one bucket: proportional to rows


def test_step_times_follow_a_machine_that_changes():
    times = StepTimes(smoothing=0.5)
    times.observe(4, 0.010)
    for _ in range(20):
        times.observe(4, 0.020)
    assert times.seconds(4) == pytest.approx(0.020, rel=1e-3)
    times.observe(4, float("nan"))  # ignored, as are empty and negative steps
    times.observe(0, 1.0)
    times.observe(4, -1.0)
    assert times.seconds(4) == pytest.approx(0.020, rel=1e-3)


def test_batch_rows_fit_within_the_slowdown_the_hardware_allows():
    # A CPU: 4 interactive rows take 15 ms; 20% more is one row of 3 ms.
    assert cpu_like().extra_rows(4, 0.2, most=12) == 1
    assert cpu_like().extra_rows(40, 0.2, most=12) == 8
    # A GPU: twelve more rows cost nothing measurable.
    assert gpu_like().extra_rows(4, 0.2, most=12) == 12
    # A size never measured is tried once: that step measures it.
    few = StepTimes()
    few.observe(4, 0.015)
    assert few.extra_rows(4, 0.2, most=12) == 12
    assert cpu_like().extra_rows(4, 0.2, most=0) == 0


def test_batch_row_budget_rules():
    times = cpu_like()  # 3 ms a step plus 3 ms a row
    assert batch_row_budget(0, False, 12, times, 0) is None  # no interactive request: every row
    # 4 interactive rows take 15 ms: SLOWDOWN of that is rows of 3 ms each.
    assert batch_row_budget(4, False, 12, times, 0) == int(0.015 * SLOWDOWN / 0.003 + 1e-9)
    assert batch_row_budget(44, False, 12, times, 0) == int(0.135 * SLOWDOWN / 0.003 + 1e-9) > 0
    # A step that prefills an interactive prompt keeps closer to its time alone: its first token's.
    assert batch_row_budget(44, True, 12, times, 0) == int(0.135 * PROMPT_SLOWDOWN / 0.003 + 1e-9)
    assert batch_row_budget(4, True, 12, times, 0) == 0
    # Batch lines that went STARVED_STEPS steps without a row get one, whatever the step holds.
    assert batch_row_budget(4, True, 12, times, STARVED_STEPS) == 1
    assert batch_row_budget(1, False, 12, cpu_like(per_row_s=0.1), STARVED_STEPS - 1) == 0
    assert batch_row_budget(4, False, 0, times, STARVED_STEPS) == 0  # nothing wanted, nothing given
    assert batch_row_budget(4, False, 12, gpu_like(), 0) == 12


class FixedTimes(StepTimes):
    """Step times fixed for a test: the engine's own steps are not learnt."""

    def __init__(self, times: StepTimes) -> None:
        super().__init__()
        self._buckets = times._buckets

    def observe(self, rows: int, seconds: float) -> None:
        pass


@pytest.mark.parametrize("hardware,held", [("cpu", True), ("gpu", False)])
def test_batch_lines_get_the_rows_interactive_requests_leave(bundled_spec, story, hardware, held):
    """On CPU-like step times, batch lines beside an interactive stream go without most rows (and still finish);
    on GPU-like ones they keep every row. The interactive reply is whole either way."""
    engine = LlamaEngine(one_thread(bundled_spec, n_seq_max=4))
    engine.step_times = FixedTimes(cpu_like() if hardware == "cpu" else gpu_like())
    engine.start()
    try:
        log = Log()
        for i in range(3):
            submit(engine, log, f"b{i}", story, 64, batch=True)
        log.wait(lambda: len(log.started) == 3, "the batch lines in their slots")
        submit(engine, log, "i0", story, 24, batch=False)
        log.wait(lambda: "i0" in log.finished, "interactive reply")
        rows_held = engine.stats()["batch_rows_held"]
        assert (rows_held > 24) if held else rows_held == 0, rows_held
        log.wait(lambda: len(log.finished) == 4, "every batch line answered")
        assert not log.failed
    finally:
        engine.close()


def test_between_interactive_requests_a_step_is_short():
    times = cpu_like()  # a step of 4 rows 15 ms, of 1 row 6 ms: a quarter of 15 ms fits no row, so one row
    assert batch_row_budget(0, False, 12, times, 0, recent_rows=4) == 1
    assert batch_row_budget(0, False, 0, times, 0, recent_rows=4) == 0
    # 32 interactive rows lately (99 ms): a quarter of that is 24.75 ms, 7 rows of 3 ms and the 3 ms fixed cost.
    assert batch_row_budget(0, False, 12, times, 0, recent_rows=32) == 7
    assert batch_row_budget(0, False, 12, cpu_like(per_row_s=1.0), 0, recent_rows=1) == 1  # one at least
    # A GPU: a step of 12 rows takes a step of one's time, so all of them.
    assert batch_row_budget(0, False, 12, gpu_like(), 0, recent_rows=4) == 12
    assert batch_row_budget(0, False, 12, StepTimes(), 0, recent_rows=4) == 12  # nothing measured yet: tried
    assert batch_row_budget(0, False, 12, times, 0, recent_rows=0) is None  # none lately: every row


def test_rows_within_a_time():
    times = cpu_like()
    assert times.rows_within(0.015, 12) == 4
    assert times.rows_within(0.001, 12) == 0
    assert times.rows_within(10.0, 12) == 12
    assert StepTimes().rows_within(0.001, 12) == 12  # never measured: tried
