"""A config larger than the machine (issue 38): six model entries of the bundled GGUF, one thread (one CPU)
each, in `topology: graph` on a 2-CPU Ray node. The front door reserves no CPU, so the model replicas that
fill the node never leave it unplaced: /health answers, the two models Ray placed serve, and the four that
wait for CPUs the placed ones hold get a 503 at once naming the model and the missing CPU (not a hang).
`topology: single` has no such split (its Ingress hosts every engine and reserves their CPUs): there the
sum is check-config's (tests/ops/test_capacity.py)."""

from __future__ import annotations

import httpx
import pytest

from app.ops.capacity import Capacity
from app.ops.config_check import check_config
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import BUNDLED, MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# A cluster of its own (six model deployments on two CPUs): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
IDS = [MODEL, *(f"copy-{i}" for i in range(1, 6))]  # MODEL keeps local-cpu.yaml's block (1 CPU, 1 replica)
SMALL = {"model_path": BUNDLED, "n_threads": 1, "n_ctx": 256, "n_seq_max": 8, "startup_self_check": False}


def _config() -> dict:
    return load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray", "args": {"models": [{"id": i, **SMALL} for i in IDS]}}]})


@pytest.fixture(scope="module")
def cluster():
    # The harness returns once the app's own /health answers (JSON), within its timeout: the front door is up.
    with ServeCluster(_config(), num_cpus=2, require_healthy=False, require_running=False, timeout_s=120) as c:
        yield c


def _placement(cluster) -> tuple[list[str], dict[str, str]] | None:
    """(models ready, why each unplaced model is) once every model is one or the other."""
    body = httpx.get(f"{cluster.url}/health", timeout=10).json()
    ready = [m for m, ok in body["models"].items() if ok]
    errors = body.get("errors", {})
    return (ready, errors) if len(ready) + len(errors) == len(IDS) and len(ready) == 2 else None


def test_check_config_says_it_does_not_fit():
    (line,) = check_config(_config(), capacity=Capacity({"CPU": 2.0}, "a 2-CPU node"))
    assert "ask 6 CPU in all" in line and "a 2-CPU node has 2" in line, line


def test_health_answers_and_names_the_unplaced_models(cluster):
    placement = wait_for(lambda: _placement(cluster), timeout=120, every=2)
    assert placement, httpx.get(f"{cluster.url}/health", timeout=10).text
    ready, errors = placement
    assert len(errors) == 4 and not set(ready) & set(errors), placement
    for model, why in errors.items():
        assert f"model {model!r} cannot be placed" in why, why
        assert "CPU 1 (the most free on a node: 0 of 2)" in why and "check-config" in why, why


def test_placed_models_answer_and_unplaced_ones_get_a_503_naming_them(cluster):
    ready, errors = wait_for(lambda: _placement(cluster), timeout=120, every=2)
    for model in ready:
        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    for model in errors:
        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=30, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 503, r.text
        assert_valid("ErrorResponse", r.json())
        error = r.json()["error"]
        assert error["code"] == "model_unplaceable" and f"model {model!r} cannot be placed" in error["message"]
        assert "CPU 1" in error["message"], error
