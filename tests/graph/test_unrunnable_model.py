"""A model llama.cpp cannot run on this node leaves its replica up and saying why, not crash-looping.

The stand-in is a real GGUF cut after its metadata: the app builds (the metadata and chat template
read fine), and llama.cpp refuses it in the replica's startup self-check: the reason reported is llama.cpp's
own (the file named, never its path), not only the child's exit status.
"""

from __future__ import annotations

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# A cluster of its own (logical GPUs, several replicas): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BROKEN = "cut-gguf"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, bundled_spec):
    cut = tmp_path_factory.mktemp("models") / "cut.gguf"
    with open(bundled_spec.path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(8 << 20))
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 512, "n_seq_max": 2},
                            {"id": BROKEN, "model_path": str(cut), "n_ctx": 256, "n_seq_max": 1,
                             "n_threads": 1}]},
        "deployments": [{"name": deployment_name(BROKEN),
                         "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                         "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0}}],
    }]})
    with ServeCluster(config, num_cpus=2, require_healthy=False) as c:
        yield c


def test_health_names_the_model_and_the_cause(cluster):
    r = httpx.get(f"{cluster.url}/health", timeout=30)
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable" and body["models"] == {MODEL: True, BROKEN: False}
    why = body["errors"][BROKEN]
    assert f"model '{BROKEN}'" in why and "cut.gguf" in why and "corrupted or incomplete" in why, why
    assert "/models" not in why and "Traceback" not in why, why  # the file by name, never its path


def test_requests_get_a_503_with_the_reason_and_other_models_serve(cluster):
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60,
                   json={"model": BROKEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 503, r.text
    assert_valid("ErrorResponse", r.json())
    message = r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "engine_unavailable" and "corrupted or incomplete" in message, message
    ok = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=120,
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_the_replica_is_not_restarted(cluster):
    handle = cluster.handle(deployment_name(BROKEN))
    before = handle.replica_info.remote().result()
    # Two more of Serve's health checks (every health_check_period_s, 10 s) answered by the same replica.
    after = wait_for(lambda: (info := handle.replica_info.remote().result())["health_checks"]
                     >= before["health_checks"] + 2 and info, timeout=60)
    assert after, "Serve did not health-check the replica twice within 60 s"
    assert after["pid"] == before["pid"] and after["replica_id"] == before["replica_id"]
    assert cluster.replicas(deployment_name(BROKEN)) == {"RUNNING": 1}
