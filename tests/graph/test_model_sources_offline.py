"""A cluster restarted without network serves what its model cache holds, and a source URL's credentials
show nowhere, in both topologies. The cache is warmed through a stand-in Hub (as a replica warms it: by
commit, which writes no ref), the Hub is then stopped and the cluster starts with HF_HUB_OFFLINE=1: the
builder pins the Hub sources and reads their headers from the cache, the replicas load the cached files.
A model whose URL carries credentials (to a port where nothing listens) fails, retryably, and /health,
its 503s and the Serve logs name it as `http://***@…`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.config.schema import CHATML_TEMPLATE
from app.config.spec import deployment_name
from app.model_sources.fetch import fetch
from app.model_sources.header import pin
from app.model_sources.progress import Progress
from app.model_sources.source import parse_source
from tests.support.fake_hub import FILE, REPO, FakeHub
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import BUNDLED, MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# Two clusters of their own (one per topology), started offline: `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TEMPLATED = "templated"  # a pinned-looking revision (@main) and its own chat_template
LOCKED = "locked"  # a URL with credentials, where nothing listens
SECRET = "s3cr3t-Pa55"
LOCKED_URL = f"http://alice:{SECRET}@127.0.0.1:9/models/m.gguf"


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    import os

    from app.config.paths import resolve_path

    root = tmp_path_factory.mktemp("warm-cache")
    saved = os.environ.get("HF_ENDPOINT")
    with FakeHub({REPO: {FILE: resolve_path(BUNDLED)}}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            fetch(pin(parse_source(f"{REPO}:q4_1")), root, Progress("warm", say=lambda _: None))
        finally:
            os.environ.pop("HF_ENDPOINT") if saved is None else os.environ.update(HF_ENDPOINT=saved)
    return root


@pytest.fixture(scope="module", params=["single", "graph"])
def cluster(request, warm_cache):
    overlays = ["configs/local-cpu.yaml"] + (["configs/local-graph.yaml"] if request.param == "graph" else [])
    small = {"n_ctx": 512, "n_seq_max": 1, "n_threads": 1, "startup_self_check": False, "routing": "load"}
    blocks = [{"name": deployment_name(m), "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
               "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0}}
              for m in (MODEL, TEMPLATED, LOCKED)] if request.param == "graph" else []
    config = load_config(*overlays, {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "model_path": f"{REPO}:q4_1", **small},
                            {"id": TEMPLATED, "model_path": f"hf://{REPO}/{FILE}@main",
                             "chat_template": CHATML_TEMPLATE, **small},
                            {"id": LOCKED, "model_path": LOCKED_URL, "chat_template": CHATML_TEMPLATE, **small}]},
        "deployments": blocks,
    }]})
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "LLAMARAY_MODEL_CACHE": str(warm_cache)}
    with ServeCluster(config, num_cpus=4, require_healthy=False, env=env) as c:
        c.topology = request.param
        yield c


def health(cluster) -> dict:
    return httpx.get(f"{cluster.url}/health", timeout=30).json()


def chat(cluster, model: str) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/chat/completions", timeout=120,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_offline_the_cached_models_serve(cluster, warm_cache):
    ready = wait_for(lambda: all((body := health(cluster)).get("models", {}).get(m) for m in (MODEL, TEMPLATED))
                     and body, timeout=300)
    assert ready, f"the cached models did not become ready offline: {health(cluster)}"
    for model in (MODEL, TEMPLATED):
        r = chat(cluster, model)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
    assert not list(warm_cache.rglob("*.incomplete")), "something was downloaded"


def test_a_url_with_credentials_fails_without_showing_them(cluster):
    failed = wait_for(lambda: (body := health(cluster)).get("states", {}).get(LOCKED) == "failed" and body,
                      timeout=300)
    assert failed, f"the model behind a dead URL did not fail: {health(cluster)}"
    why = failed["errors"][LOCKED]
    assert "http://***@127.0.0.1:9/models/m.gguf" in why and "next try in" in why, why
    r = chat(cluster, LOCKED)
    assert r.status_code == 503, r.text
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["code"] == "model_fetch_failed"
    assert "***@" in r.json()["error"]["message"] and SECRET not in r.text
    assert SECRET not in httpx.get(f"{cluster.url}/health", timeout=30).text
    if cluster.topology == "graph":
        assert cluster.replicas(deployment_name(LOCKED)) == {"RUNNING": 1}
    import ray

    # Ray Serve itself logs the app's arguments as written when it builds it (out of our hands; the docs
    # say so); every other line, ours, must not name them.
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    leaked = [f"{p.name}: {line[:200]}" for p in logs.glob("*.log")
              for line in p.read_text(errors="replace").splitlines()
              if SECRET in line and "Importing application 'llamaray' with arguments" not in line]
    assert not leaked, f"the credentials are in the Serve logs: {leaked}"
