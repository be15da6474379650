"""Batches outlive what runs them, in both topologies (slow: kills and waits for replicas, and redeploys the app):
the batch runner actor killed mid-batch, then every replica between it and the model (the Ingress in `single`;
the ChatProcessor and the model's replica in `graph`), then the whole application deleted and deployed again over
the same store; each time the batch ends `completed` with every custom_id answered exactly once."""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import time
from collections import Counter

import openai
import pytest
import ray

from deployments.batch_runner import RUNNER_ACTOR
from tests.support.serve_harness import APP, KEY_A, MODEL, quick_to_stop
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def lines(n: int, tag: str) -> list[dict]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "max_tokens": 24, "temperature": 0,
                      "messages": [{"role": "user", "content": f"Count to ten, {tag} {i}."}]}} for i in range(n)]


def client_of(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0, timeout=30)


def start(cluster, batch_lines: list[dict]) -> str:
    client = client_of(cluster)
    data = b"".join(json.dumps(line).encode() + b"\n" for line in batch_lines)
    file = client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h").id


def counts(cluster, batch_id: str):
    """The batch as its owner reads it, or None while the server cannot answer (a replica being replaced)."""
    try:
        return client_of(cluster).batches.retrieve(batch_id)
    except (openai.APIConnectionError, openai.APIStatusError):
        return None


def wait_answered(cluster, batch_id: str, at_least: int) -> None:
    def far_enough():
        batch = counts(cluster, batch_id)
        return batch is not None and batch.request_counts.completed >= at_least
    assert wait_for(far_enough, timeout=300, every=0.5), counts(cluster, batch_id)


def assert_each_line_once(cluster, batch_id: str, batch_lines: list[dict]) -> None:
    def ended():
        batch = counts(cluster, batch_id)
        return batch if batch is not None and batch.status in ("completed", "failed", "expired", "cancelled") \
            else None
    batch = wait_for(ended, timeout=600, every=1)
    assert batch is not None and batch.status == "completed", counts(cluster, batch_id)
    output = [json.loads(line) for line in
              client_of(cluster).files.content(batch.output_file_id).content.splitlines()]
    answered = Counter(o["custom_id"] for o in output)
    assert set(answered) == {line["custom_id"] for line in batch_lines}
    assert set(answered.values()) == {1}, [k for k, v in answered.items() if v > 1]
    assert batch.request_counts.completed == len(batch_lines) and batch.error_file_id is None


def runner_actor():
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].endswith(f"::{RUNNER_ACTOR}") and f"::{APP}::" in a["name"]]
    return names


def test_a_batch_outlives_its_runner_and_the_replicas_that_run_it(cluster):
    batch_lines = lines(24, "kill")
    batch_id = start(cluster, batch_lines)
    wait_answered(cluster, batch_id, 3)
    (name,) = runner_actor()
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    # Serve's controller makes a new one (under the same name), which goes on from the chunks written.
    wait_answered(cluster, batch_id, 8)
    # Every replica between the runner and the engine, killed while lines are in flight.
    victims = ["Ingress"] if cluster.topology == "single" else ["ChatProcessor", f"LlamaModel-{MODEL}"]
    pids = cluster.identities()
    for deployment in victims:
        os.kill(pids[deployment][1], signal.SIGKILL)
    assert_each_line_once(cluster, batch_id, batch_lines)
    assert cluster.wait_healthy(300)


def test_a_batch_outlives_the_application_deleted_and_deployed_again(cluster):
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    batch_lines = lines(16, "redeploy")
    batch_id = start(cluster, batch_lines)
    wait_answered(cluster, batch_id, 3)
    serve.delete(APP)  # the runner goes with the app; the store keeps the batch
    assert wait_for(lambda: APP not in serve.status().applications, timeout=120)
    config = copy.deepcopy(cluster.config)
    config.pop("http_options", None)
    config["proxy_location"] = "HeadOnly"
    serve_api.serve_start().deploy_apps(ServeDeploySchema.model_validate(quick_to_stop(config)), _blocking=False)
    cluster._wait_ready()
    started = time.monotonic()
    assert_each_line_once(cluster, batch_id, batch_lines)
    assert time.monotonic() - started < 600
