"""Engine errors (app/engine/errors.py) become, at the edge, exactly the protocol errors the engine used to
raise itself: same status, type, code, param, message and headers. And they pickle (they cross Ray hops)."""

from __future__ import annotations

import pickle

import pytest

from app.api.errors import (
    APIError,
    as_api_error,
    context_length_exceeded,
    internal_error,
    invalid_request,
    overloaded,
)
from app.engine.errors import ContextExceeded, EngineError, bad_input, internal, not_found, unavailable

CASES = [
    (bad_input("`n` is 9.", "n", "n_too_large"), invalid_request("`n` is 9.", param="n", code="n_too_large")),
    (bad_input("Bad id.", "tokens[2]", "invalid_token"), invalid_request("Bad id.", param="tokens[2]",
                                                                         code="invalid_token")),
    # A prompt's images are parts of its messages: the client's field.
    (bad_input("No images.", "images", "images_unsupported"),
     invalid_request("No images.", param="messages", code="images_unsupported")),
    (ContextExceeded(512, 500, 20), context_length_exceeded(512, 500, 20)),
    (ContextExceeded(512, 600, None, at_least=True), context_length_exceeded(512, 600, None, at_least=True)),
    (not_found("Model `m` has no adapter `x` loaded.", "model", "model_not_found"),
     APIError("Model `m` has no adapter `x` loaded.", param="model", code="model_not_found", status=404,
              type="invalid_request_error")),
    (unavailable("The model engine stopped."),
     APIError("The model engine stopped.", status=503, type="server_error", code="engine_unavailable")),
    (internal("Sampling failed for this request."), internal_error("Sampling failed for this request.", logged=True)),
    (internal("The model could not embed these inputs.", code="decode_failed", logged=False),
     APIError("The model could not embed these inputs.", status=500, type="server_error", code="decode_failed")),
    (EngineError("overloaded", "The server is overloaded; retry shortly."), overloaded()),
]


def shape(err: APIError) -> tuple:
    return err.status, err.to_dict(), err.headers, err.logged


@pytest.mark.parametrize("engine_error, expected", CASES)
def test_an_engine_error_maps_to_the_protocols_error(engine_error, expected):
    assert shape(as_api_error(engine_error)) == shape(expected)


@pytest.mark.parametrize("engine_error, expected", CASES)
def test_an_engine_error_pickles_by_its_fields(engine_error, expected):
    again = pickle.loads(pickle.dumps(engine_error))
    assert type(again) is type(engine_error) and vars(again) == vars(engine_error)
    assert shape(as_api_error(again)) == shape(expected)


def test_an_engine_error_is_found_inside_a_wrapper_and_as_a_cause():
    class Wrapper(Exception):  # as Ray's RayTaskError carries the original in `.cause`
        def __init__(self, cause: BaseException) -> None:
            super().__init__("wrapped")
            self.cause = cause

    error = bad_input("Bad id.", "tokens[0]", "invalid_token")
    assert as_api_error(Wrapper(error)).param == "tokens[0]"
    try:
        try:
            raise error
        except EngineError as exc:
            raise RuntimeError("while streaming") from exc
    except RuntimeError as outer:
        assert as_api_error(outer).code == "invalid_token"
