"""Models fetched by name, not placed on any node: from a stand-in Hugging Face Hub (huggingface_hub through
HF_ENDPOINT) and from S3 (moto's server through AWS_ENDPOINT_URL), in both topologies. The builder only
range-reads the header; the model replicas download into a fresh per-node cache (LLAMARAY_MODEL_CACHE),
once per node however many replicas start there; a wrong sha256 leaves its replica up, answering 503s that
name the checksum."""

from __future__ import annotations

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.fake_hub import FILE, REPO, FakeHub
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import BUNDLED, MODEL, ServeCluster, load_config
from tests.support.waiting import wait_for

# Four clusters of their own (two sources x two topologies), each fetching the model: `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
BAD = "bad-sha"
BAD_FILE = "cut-Q8_0.gguf"  # the bundled GGUF cut after its metadata: other bytes, its own download
WRONG_SHA = "0" * 64
BUCKET = "models"


@pytest.fixture(scope="module", params=["hf", "s3"])
def source(request, tmp_path_factory):
    """(kind, env for the cluster, model_path of the good model, of the bad one, counter of downloads)."""
    from app.config.paths import resolve_path

    gguf = resolve_path(BUNDLED)
    cut = tmp_path_factory.mktemp("gguf") / BAD_FILE
    with open(gguf, "rb") as src:
        cut.write_bytes(src.read(8 << 20))
    if request.param == "hf":
        with FakeHub({REPO: {FILE: gguf, BAD_FILE: cut}}) as hub:
            yield ("hf", {"HF_ENDPOINT": hub.url}, f"{REPO}:q4_1", f"hf://{REPO}/{BAD_FILE}", hub)
        return
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)
    s3.upload_file(str(gguf), BUCKET, f"smollm2/{FILE}")
    s3.upload_file(str(cut), BUCKET, f"smollm2/{BAD_FILE}")
    try:
        yield ("s3", env, f"s3://{BUCKET}/smollm2/{FILE}", f"s3://{BUCKET}/smollm2/{BAD_FILE}", None)
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["single", "graph"])
def cluster(request, source, tmp_path_factory):
    kind, env, good, bad, _ = source
    cache = tmp_path_factory.mktemp(f"cache-{kind}-{request.param}")
    overlays = ["configs/local-cpu.yaml"] + (["configs/local-graph.yaml"] if request.param == "graph" else [])
    blocks = [{"name": deployment_name(MODEL), "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
               "max_ongoing_requests": 2, "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}},
              {"name": deployment_name(BAD), "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
               "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0}}] if request.param == "graph" else []
    config = load_config(*overlays, {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "model_path": good, "n_ctx": 512, "n_seq_max": 2, "n_threads": 1,
                             "startup_self_check": False, "routing": "load"},
                            {"id": BAD, "model_path": bad, "sha256": WRONG_SHA, "n_ctx": 256, "n_seq_max": 1,
                             "n_threads": 1}]},
        "deployments": blocks,
    }]})
    with ServeCluster(config, num_cpus=4, require_healthy=False,
                      env={**env, "LLAMARAY_MODEL_CACHE": str(cache)}) as c:
        c.cache = cache
        c.kind = kind
        c.hub = source[4]
        yield c


def health(cluster) -> dict:
    return httpx.get(f"{cluster.url}/health", timeout=30).json()


def test_the_model_arrives_through_its_source_and_serves(cluster):
    ready = wait_for(lambda: (body := health(cluster)).get("models", {}).get(MODEL) and body, timeout=300)
    assert ready, f"the model did not become ready: {health(cluster)}"
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=120,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    copies = [p for p in cluster.cache.rglob(FILE) if p.is_file()]
    assert len(copies) == 1, f"expected one copy in the node's cache: {copies}"
    assert not list(cluster.cache.rglob("*.part")) and not list(cluster.cache.rglob("*.incomplete"))


def test_one_node_downloads_once_however_many_replicas(cluster):
    assert wait_for(lambda: health(cluster).get("models", {}).get(MODEL), timeout=300)
    if cluster.hub is not None:
        assert cluster.hub.gets[(REPO, FILE)] == 1, dict(cluster.hub.gets)
        # The builder read the header by ranges: a small part of the file, never all of it.
        assert 0 < cluster.hub.range_bytes[(REPO, FILE)] < 8 << 20
    if cluster.topology == "graph":
        handle = cluster.handle(deployment_name(MODEL))
        # routing: load (Serve's random pick of two), so both replicas answer replica_info in turn
        seen: dict[str, int] = {}

        def both_replicas() -> bool:
            info = handle.replica_info.remote().result()
            seen[info["replica_id"]] = info["downloaded_bytes"]
            return len(seen) == 2

        assert wait_for(both_replicas, timeout=60, every=0.1), f"only saw replicas {seen}"
        assert sorted(v > 0 for v in seen.values()) == [False, True], f"bytes downloaded per replica: {seen}"
    else:
        info = cluster.handle("Ingress").replica_info.remote().result()
        assert info["models"][MODEL]["downloaded_bytes"] > 0


def test_a_wrong_sha256_gives_503s_naming_the_checksum(cluster):
    failed = wait_for(lambda: (body := health(cluster)).get("states", {}).get(BAD) == "failed" and body, timeout=300)
    assert failed, f"the model with a wrong sha256 did not fail: {health(cluster)}"
    assert failed["status"] == "unavailable"
    why = failed["errors"][BAD]
    assert "checksum mismatch" in why and WRONG_SHA in why and "not retried" in why, why
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60,
                   json={"model": BAD, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 503, r.text
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["code"] == "model_fetch_failed" and "checksum mismatch" in r.json()["error"]["message"]
    if cluster.topology == "graph":
        assert cluster.replicas(deployment_name(BAD)) == {"RUNNING": 1}
