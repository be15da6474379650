"""Two Ray nodes on this machine, each with its own model cache (LLAMARAY_MODEL_CACHE in each node's
environment, as on a real cluster): a model from the (stand-in) Hub with one replica per node is fetched
once by each node, into that node's cache."""

from __future__ import annotations

import httpx
import pytest

from app.config.paths import resolve_path
from app.config.spec import deployment_name
from tests.support.fake_hub import FILE, REPO, FakeHub
from tests.support.serve_harness import BUNDLED, MODEL, ServeCluster, load_config, ray_nodes
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    caches = {name: tmp_path_factory.mktemp(f"cache-{name}") for name in ("node_a", "node_b")}
    with FakeHub({REPO: {FILE: resolve_path(BUNDLED)}}) as hub, ray_nodes(
            {name: {"LLAMARAY_MODEL_CACHE": str(cache), "HF_ENDPOINT": hub.url} for name, cache in caches.items()}
    ) as cluster:
        yield cluster, caches, hub


def test_each_node_fetches_its_own_copy(two_nodes):
    cluster, caches, hub = two_nodes
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "model_path": f"hf://{REPO}/{FILE}", "n_ctx": 512, "n_seq_max": 2,
                             "n_threads": 1, "startup_self_check": False,
                             "routing": "load"}]},
        "deployments": [{"name": deployment_name(MODEL), "max_replicas_per_node": 1,
                         "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                         "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}}],
    }]})
    with ServeCluster(config, address=cluster.address, env={"HF_ENDPOINT": hub.url}) as serve:
        r = httpx.post(f"{serve.url}/v1/chat/completions", timeout=120,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        handle = serve.handle(deployment_name(MODEL))
        seen: dict[str, dict] = {}

        def both_replicas_loaded() -> bool:
            info = handle.replica_info.remote().result()
            seen[info["replica_id"]] = info
            return len(seen) == 2 and all(i["path"] for i in seen.values())

        assert wait_for(both_replicas_loaded, timeout=120, every=0.1), seen
        assert len({i["node_id"] for i in seen.values()}) == 2, "both replicas on one node"
        assert all(i["downloaded_bytes"] > 0 for i in seen.values()), seen
        for name, cache in caches.items():
            assert [p for p in cache.rglob(FILE) if p.is_file()], f"{name} has no copy in its cache {cache}"
        assert {i["path"].split("/hub/")[0] for i in seen.values()} == {str(c) for c in caches.values()}
        assert hub.gets[(REPO, FILE)] == 2
