"""An engine error raised in a model replica crosses the Ray hop inside RayTaskError (pickled) and becomes,
at the edge (deployments/error_mapping.py), the protocol's error the client gets."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("ray")

from ray.exceptions import RayTaskError  # noqa: E402

from app.api.errors import context_length_exceeded, invalid_request  # noqa: E402
from app.engine.errors import ContextExceeded, bad_input, unavailable  # noqa: E402
from deployments.error_mapping import to_api_error  # noqa: E402


@pytest.mark.parametrize("error, expected", [
    (bad_input("No images.", "images", "images_unsupported"),
     invalid_request("No images.", param="messages", code="images_unsupported")),
    (ContextExceeded(1024, 1000, 100), context_length_exceeded(1024, 1000, 100)),
])
def test_an_engine_error_across_the_hop_is_the_protocols_error(error, expected):
    # As Ray does: the task's error pickled, then re-raised as an instance of its cause's class.
    arrived = pickle.loads(pickle.dumps(RayTaskError("generate", "Traceback ...", error))).as_instanceof_cause()
    api = to_api_error(arrived)
    assert (api.status, api.to_dict()) == (expected.status, expected.to_dict())


def test_an_unavailable_engine_is_a_503_in_both_topologies():
    error = unavailable("The model engine stopped.")
    for seen in (error, RayTaskError("generate", "Traceback ...", error).as_instanceof_cause()):
        api = to_api_error(seen)
        assert (api.status, api.type, api.code, api.message) == (503, "server_error", "engine_unavailable",
                                                                 "The model engine stopped.")
