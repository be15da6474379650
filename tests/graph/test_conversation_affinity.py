"""Prefix-aware routing through the real graph: two model replicas on logical GPUs, one conversation
of several turns. Every turn after the first reuses the whole previous prompt from the KV cache,
which only the replica that served the previous turn holds (with Serve's default router each turn
would land on either replica: all three follow-ups on the same one by chance 1 time in 8)."""

from __future__ import annotations

import httpx
import pytest

from app.config.spec import deployment_name
from app.ops.placement import PREFIX_ROUTER_CLASS
from tests.support.serve_harness import APP, MODEL, ServeCluster, load_config

# A cluster of its own (logical GPUs, several replicas): a scenario for `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SYSTEM = " ".join(f"Rule {i}: the {w} in room {i * 3 % 17} is checked every {i % 5 + 2} days."
                  for i, w in enumerate(("lamp", "clock", "valve", "door", "map", "pump") * 5))


def test_a_conversation_stays_on_the_replica_that_holds_its_prefix():
    from ray.serve.context import _get_global_client

    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 2048, "n_seq_max": 2, "n_threads": 1, "n_gpu_layers": "auto",
                               "routing": "prefix"}]},
        "deployments": [{"name": deployment_name(MODEL), "max_ongoing_requests": 2,
                         "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                         "ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}],
    }]})
    with ServeCluster(config, num_cpus=4, num_gpus=2) as cluster:
        assert cluster.replicas(deployment_name(MODEL)) == {"RUNNING": 2}
        details = _get_global_client().get_serve_details()
        model = details["applications"][APP]["deployments"][deployment_name(MODEL)]
        assert model["deployment_config"]["request_router_config"]["request_router_class"] == PREFIX_ROUTER_CLASS

        messages = [{"role": "system", "content": SYSTEM}]
        usage = []
        with httpx.Client(base_url=cluster.url, timeout=120) as http:
            for turn in range(4):
                messages.append({"role": "user", "content": f"Question {turn}: which rule mentions a pump?"})
                r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                            "max_tokens": 6, "temperature": 0, "seed": turn})
                assert r.status_code == 200, r.text
                body = r.json()
                usage.append(body["usage"])
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        prompts = [u["prompt_tokens"] for u in usage]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usage]
        assert prompts[0] > 300, prompts  # a prefix long enough to route on
        assert cached[0] == 0, cached     # nobody had seen it
        for t in range(1, 4):
            # the previous turn's whole prompt (at least) was still in that replica's KV
            assert cached[t] >= prompts[t - 1] - 1, (t, prompts, cached)
