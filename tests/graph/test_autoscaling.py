"""Scale-up that can be seen on one machine.

1. Logical GPUs: ray.init(num_gpus=2), a model deployment of num_gpus 1 and max_replicas 4.
   A load ramp scales LlamaModel to 2 replicas and no further (the rest wait for GPUs), then
   back down when the load ends; no request fails. Read from Serve's own status.
2. Cluster autoscaling (slow): ray.cluster_utils.AutoscalingCluster with a GPU-less head and a
   fake GPU worker node type (min_workers 0): the ramp makes Ray's autoscaler add GPU nodes for
   the new replicas and remove them after the load.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.config.spec import deployment_name
from tests.support.serve_harness import MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# A cluster of its own (logical GPUs, several replicas): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MODEL_DEPLOYMENT = deployment_name(MODEL)
FAKE_BASE = Path(__file__).resolve().parent.parent / "data" / "fake_multinode.yaml"


def scaling_config(min_replicas: int) -> dict:
    """serve_config.yaml with a tiny model context and fast autoscaling delays for a test."""
    return load_config({"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 512, "n_seq_max": 2, "n_threads": 1}],
                 "auth": {"required": False}},  # a test of scaling, on 127.0.0.1
        "deployments": [
            {"name": "Ingress", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}, "ray_actor_options": {"num_cpus": 0.1}},
            {"name": "ChatProcessor", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}, "ray_actor_options": {"num_cpus": 0.1}},
            {"name": MODEL_DEPLOYMENT, "max_ongoing_requests": 2, "max_queued_requests": 100,
             "autoscaling_config": {"min_replicas": min_replicas, "max_replicas": 4, "target_ongoing_requests": 1,
                                    "upscale_delay_s": 1, "downscale_delay_s": 4, "look_back_period_s": 2,
                                    "metrics_interval_s": 0.5},
             "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1}},
        ],
    }]})


class Ramp:
    """Closed-loop streaming load at `concurrency` workers until stopped; records failures."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.concurrency = url, concurrency
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(concurrency)]

    def _worker(self) -> None:
        body = {"model": MODEL, "max_tokens": 24, "stream": True,
                "messages": [{"role": "user", "content": "Describe the sea."}]}
        with httpx.Client(base_url=self.url, timeout=300) as c:
            while not self.stop.is_set():
                try:
                    r = c.post("/v1/chat/completions", json=body)
                    if r.status_code != 200 or not r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text:
                        self.failures.append(f"{r.status_code}: {r.text[-300:]}")
                    else:
                        self.ok += 1
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))

    def __enter__(self) -> "Ramp":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)



def test_logical_gpus_bound_model_replicas():
    import ray

    with ServeCluster(scaling_config(min_replicas=1), num_cpus=8, num_gpus=2) as cluster:
        assert cluster.replicas(MODEL_DEPLOYMENT) == {"RUNNING": 1}
        seen_running = []
        with Ramp(cluster.url, concurrency=8) as ramp:
            def at_two():
                states = cluster.replicas(MODEL_DEPLOYMENT)
                seen_running.append(states.get("RUNNING", 0))
                return states.get("RUNNING", 0) == 2 and states
            assert wait_for(at_two, timeout=120), cluster.replicas(MODEL_DEPLOYMENT)
            # Serve wants more (8 requests, target 1 each) but only 2 GPUs exist: the rest wait.
            def wants_more():
                states = cluster.replicas(MODEL_DEPLOYMENT)
                seen_running.append(states.get("RUNNING", 0))
                return sum(states.values()) > 2 and states
            assert wait_for(wants_more, timeout=30), cluster.replicas(MODEL_DEPLOYMENT)
            assert ray.available_resources().get("GPU", 0) == 0
            time.sleep(5)
            seen_running.append(cluster.replicas(MODEL_DEPLOYMENT).get("RUNNING", 0))
        assert max(seen_running) == 2
        assert ramp.ok > 0 and ramp.failures == []
        # Load over: back down to min_replicas, and the GPUs are free again.
        assert wait_for(lambda: cluster.replicas(MODEL_DEPLOYMENT) == {"RUNNING": 1}, timeout=90), \
            cluster.replicas(MODEL_DEPLOYMENT)
        assert wait_for(lambda: ray.available_resources().get("GPU", 0) == 1, timeout=30)


def test_autoscaling_cluster_adds_and_removes_gpu_nodes():
    import ray
    from ray.cluster_utils import AutoscalingCluster

    # AutoscalingCluster shells out to the `ray` CLI: use this venv's.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    class Cluster(AutoscalingCluster):
        def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **kwargs):
            config = yaml.safe_load(FAKE_BASE.read_text())
            config["available_node_types"] = dict(worker_node_types)
            config["available_node_types"]["ray.head.default"] = {
                "resources": head_resources, "node_config": {}, "max_workers": 0}
            config.update(kwargs)
            return config

    fake = Cluster(
        head_resources={"CPU": 2},
        worker_node_types={"gpu_node": {"resources": {"CPU": 1, "GPU": 1}, "node_config": {},
                                        "min_workers": 0, "max_workers": 3}},
        idle_timeout_minutes=0.2,
    )
    fake.start()
    try:
        with ServeCluster(scaling_config(min_replicas=1), address="auto", timeout_s=420) as cluster:
            def gpu_nodes() -> int:
                return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0)

            assert gpu_nodes() == 1  # the first replica brought up one GPU node
            seen_nodes, seen_running = [1], [1]
            with Ramp(cluster.url, concurrency=6) as ramp:
                def scaled():
                    seen_nodes.append(gpu_nodes())
                    seen_running.append(cluster.replicas(MODEL_DEPLOYMENT).get("RUNNING", 0))
                    return seen_running[-1] >= 2 and seen_nodes[-1] >= 2
                assert wait_for(scaled, timeout=300, every=1), (seen_nodes[-5:], seen_running[-5:])
                time.sleep(5)
            assert ramp.ok > 0 and ramp.failures == []
            assert wait_for(lambda: cluster.replicas(MODEL_DEPLOYMENT) == {"RUNNING": 1}, timeout=120)
            assert wait_for(lambda: gpu_nodes() == 1, timeout=180, every=2), gpu_nodes()
            assert max(seen_nodes) >= 2 and max(seen_running) >= 2
    finally:
        fake.shutdown()


def test_cold_start_from_zero_model_replicas():
    config = scaling_config(min_replicas=0)
    config["applications"][0]["deployments"][2]["autoscaling_config"]["initial_replicas"] = 0
    with ServeCluster(config, num_cpus=4, num_gpus=1) as cluster:  # waits for /health 200
        assert sum(cluster.replicas(MODEL_DEPLOYMENT).values()) == 0  # healthy, and cold
        t0 = time.monotonic()
        r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=120, json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 60  # the first request waited for a replica, boundedly
        assert cluster.replicas(MODEL_DEPLOYMENT).get("RUNNING") == 1
