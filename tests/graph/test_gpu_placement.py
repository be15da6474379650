"""The production serve_config.yaml on logical GPUs: the model replica holds exactly one GPU,
the CPU deployments hold none, and the graph still serves (llama.cpp itself runs on the CPU)."""

from __future__ import annotations

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.serve_harness import MODEL, ServeCluster, load_config
# A cluster of its own (logical GPUs, several replicas): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_model_replica_reserves_one_gpu_cpu_deployments_none():
    import ray

    # serve_config.yaml unchanged except what keeps a 2-core machine responsive.
    config = load_config({"applications": [{"name": "llamaray", "args": {"models": [
        {"id": MODEL, "n_ctx": 512, "n_seq_max": 2, "n_threads": 1}], "auth": {"required": False}}}]})
    model = next(d for d in config["applications"][0]["deployments"] if d["name"] == deployment_name(MODEL))
    assert model["ray_actor_options"]["num_gpus"] == 1  # the production shape is what we test

    with ServeCluster(config, num_cpus=8, num_gpus=2) as cluster:
        info = cluster.handle(deployment_name(MODEL)).replica_info.remote().result()
        assert info["resources"].get("GPU") == 1
        for name in ("Ingress", "ChatProcessor"):
            assert cluster.handle(name).replica_info.remote().result()["resources"].get("GPU", 0) == 0, name
        used = ray.cluster_resources()["GPU"] - ray.available_resources().get("GPU", 0)
        assert used == 1
        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
