"""Refusals in the log (app/observe/refusals.py): one INFO line each with the request id and key name, one line
per interval for a key that keeps getting the same refusal (counting the rest), and Serve's "Request failed."
traceback dropped for refusals only."""

from __future__ import annotations

import logging
import sys

from app.api.errors import APIError, invalid_request, overloaded, service_unavailable
from app.engine.errors import bad_input
from app.observe.refusals import RefusalFilter, RefusalLog, is_refusal


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_what_is_a_refusal() -> None:
    assert is_refusal(invalid_request("x")) and is_refusal(APIError("limit", status=429, code="rate_limit_exceeded"))
    assert is_refusal(overloaded()) and is_refusal(bad_input("too long", "prompt", "x"))  # an engine's 400
    assert not is_refusal(service_unavailable("replica gone")) and not is_refusal(RuntimeError("bug"))
    assert not is_refusal(APIError("boom", status=500)) and not is_refusal(None)


def test_a_flood_of_one_refusal_is_one_line_an_interval(caplog) -> None:
    clock = Clock()
    refusals = RefusalLog(every_s=10, clock=clock)
    caplog.set_level(logging.INFO, logger="llamaray.refusals")
    limit = APIError("Rate limit reached.", status=429, type="requests", code="rate_limit_exceeded")
    written = [refusals.refused(limit, request_id=f"r{i}", tenant="team-a", route="/v1/chat/completions")
               for i in range(1000)]
    assert written.count(True) == 1
    refusals.refused(invalid_request("bad", code="invalid_value"), tenant="team-a")  # another kind: its own line
    refusals.refused(limit, tenant="team-b")  # another key: its own line
    clock.now = 10.5
    refusals.refused(limit, request_id="r-next", tenant="team-a")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all(r.levelname == "INFO" and not r.exc_info for r in caplog.records)
    assert lines[0].startswith("refused 429 rate_limit_exceeded: request r0, key team-a, /v1/chat/completions")
    assert "request r-next" in lines[3] and "(and 999 more like it in the last 10 s)" in lines[3]


def test_the_kinds_remembered_are_bounded() -> None:
    refusals = RefusalLog(max_kinds=8)
    for i in range(100):
        refusals.refused(invalid_request("x"), tenant=f"key-{i}")
    assert len(refusals._last) == 8


def test_serve_s_traceback_is_dropped_for_refusals_only() -> None:
    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            return logging.LogRecord("ray.serve", logging.ERROR, __file__, 1, "Request failed.", None, sys.exc_info())

    keep = RefusalFilter()
    assert not keep.filter(record(APIError("limit", status=429)))
    assert not keep.filter(record(bad_input("too long", "prompt", "x")))
    assert keep.filter(record(RuntimeError("a bug")))
    assert keep.filter(record(service_unavailable("replica gone")))
    assert keep.filter(logging.LogRecord("ray.serve", logging.INFO, __file__, 1, "GET / 200", None, None))
