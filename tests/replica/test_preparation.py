"""A replica's fetch in the background: downloading, failed (retried with backoff or not), then ready."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from app.replica import preparation
from app.model_sources.fetch import FetchError
from app.replica.preparation import Preparation
from app.serving.health import health_body
from app.serving.models import ModelState
from tests.support.waiting import wait_for


@pytest.fixture
def spec(bundled_spec):
    return replace(bundled_spec, path="", source="hf://o/r/m.gguf@abc")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_downloading_then_ready(spec, monkeypatch):
    gate, started = threading.Event(), []
    monkeypatch.setattr(preparation, "fetch_spec", lambda s, p: (p.begin(100), p.advance(40), gate.wait(30),
                                                                 replace(s, path="/m.gguf"))[-1])
    prep = Preparation(spec, started.append)
    assert wait_for(lambda: "40 B of 100 B (40%)" in (prep.state().reason or ""), 10), prep.state()
    assert prep.state().state == "downloading"
    gate.set()
    assert wait_for(lambda: started, 10) and started[0].path == "/m.gguf"
    assert prep.state() is None


def test_a_retryable_failure_is_tried_again_with_backoff(spec, monkeypatch):
    clock, calls = Clock(), []

    def flaky(s, p):
        calls.append(1)
        if len(calls) < 3:
            raise FetchError("network", "hf://o/r/m.gguf: connection refused")
        return replace(s, path="/m.gguf")

    monkeypatch.setattr(preparation, "fetch_spec", flaky)
    started = []
    prep = Preparation(spec, started.append, clock=clock, retry_s=(30, 45))
    assert wait_for(lambda: prep.failure and not prep.busy, 10)
    assert prep.state() == ModelState("failed", "model 'smollm2-135m' could not be fetched: hf://o/r/m.gguf: "
                                                "connection refused; next try in 30 s")
    assert not prep.maybe_retry()
    clock.now = 30
    assert prep.maybe_retry()
    assert wait_for(lambda: prep.failure and not prep.busy, 10) and prep.retry_at == 30 + 45  # doubled, capped at 45
    clock.now = 75
    assert prep.maybe_retry() and wait_for(lambda: started, 10) and len(calls) == 3


def test_a_lasting_failure_is_not_retried(spec, monkeypatch):
    def mismatch(s, p):
        raise FetchError("checksum", "checksum mismatch for m.gguf: sha256 1234, the config says 0000")

    monkeypatch.setattr(preparation, "fetch_spec", mismatch)
    clock = Clock()
    prep = Preparation(spec, lambda s: None, clock=clock)
    assert wait_for(lambda: prep.failure and not prep.busy, 10)
    clock.now = 1e6
    assert not prep.maybe_retry()
    assert prep.state().state == "failed" and "checksum mismatch" in prep.state().reason
    assert "not retried" in prep.state().reason


def test_health_reports_downloads_and_failures():
    states = {"a": ModelState("downloading", "downloading hf://o/r/a.gguf: 1 MiB of 2 MiB (50%)"),
              "b": ModelState("ready")}
    assert health_body(states, ["a", "b"], True) == (503, {
        "status": "downloading", "models": {"a": False, "b": True}, "states": {"a": "downloading", "b": "ready"},
        "downloads": {"a": "downloading hf://o/r/a.gguf: 1 MiB of 2 MiB (50%)"}})
    states["b"] = ModelState("failed", "model 'b' could not be fetched: checksum mismatch")
    status, body = health_body(states, ["a", "b"], True)
    assert status == 503 and body["status"] == "unavailable" and "checksum" in body["errors"]["b"]
    assert health_body(states, ["a", "b"], False) == (503, {"status": "unavailable"})
