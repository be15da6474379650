"""deployments/handles.py: which of a deployment's handles a call goes on. The options are said in full, since a
node's environment changes Serve's defaults (RAY_SERVE_USE_GRPC_BY_DEFAULT, part of Ray Serve's throughput
settings that clusters start with, makes a handle by value unless told otherwise)."""

from __future__ import annotations

from deployments.handles import BY_VALUE_MAX_BYTES, StreamHop, unary


class RecordingHandle:
    """Stands in for a DeploymentHandle: records the options each derived handle was made with."""

    def __init__(self, options: dict | None = None) -> None:
        self.options_given = options or {}

    def options(self, **kwargs) -> "RecordingHandle":
        return RecordingHandle({**self.options_given, **kwargs})


def test_a_large_request_goes_by_reference_whatever_the_default():
    hop = StreamHop(RecordingHandle())
    large = hop.to(b"x" * (BY_VALUE_MAX_BYTES + 1))
    assert large.options_given == {"_by_reference": True, "stream": True}


def test_a_usual_request_goes_by_value():
    hop = StreamHop(RecordingHandle())
    assert hop.to({"messages": [{"role": "user", "content": "hi"}]}).options_given == \
        {"_by_reference": False, "stream": True}


def test_calls_that_answer_once_go_by_reference():
    assert unary(RecordingHandle()).options_given == {"_by_reference": True}
