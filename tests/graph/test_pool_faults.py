"""A pool's faults through a real app of its own, in each topology: the bundled GGUF under two ids and a copy of
it cut short (made here, in a temporary folder: its header reads, so the app builds; its tensors lie past the
end, so llama.cpp refuses it).

- A failed load is a 503 naming the model and llama.cpp's reason, every time, fast (the failure is remembered
  for failed_load_retry_s, not read again by every request), and the replica keeps serving its other models.
- Graph, two pool replicas: one replica killed while it loads a model. A stream on the other replica's model
  runs to its end and that model keeps answering; the request waiting on the dead load gets a 503 in OpenAI's
  shape, not a hang; Serve restarts the replica and the model loads again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from app.config.paths import resolve_path
from app.ops.pools import pool_deployment_name
from tests.support.serve_harness import pool_deployments, APP, BUNDLED, POOL, ServeCluster, load_config, sse_json
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
GOOD_A, GOOD_B, CUT = "fault-a", "fault-b", "fault-cut"
POOL_NAME = "faults"
RETRY_S = 120  # the failure is remembered for longer than the test takes
# Special tokens of SmolLM2 (<|endoftext|>, <|im_start|>, <|im_end|>) banned: a reply runs to max_tokens.
NO_END = {"0": -100, "1": -100, "2": -100}


def faults_config(shape: str, cut: Path) -> dict:
    config = load_config("configs/local-cpu.yaml")
    app = config["applications"][0]
    common = {"pool": POOL_NAME, "n_ctx": 512, "n_seq_max": 2, "n_threads": 1, "n_gpu_layers": 0}
    app["args"]["models"] = [{"id": GOOD_A, "model_path": BUNDLED, **common},
                             {"id": GOOD_B, "model_path": BUNDLED, **common},
                             {"id": CUT, "model_path": str(cut), **common}]
    app["args"]["pools"] = [{"name": POOL_NAME, "max_models": 3, "failed_load_retry_s": RETRY_S}]
    app["args"]["topology"] = shape
    app["deployments"] = pool_deployments(shape, POOL_NAME, max_ongoing_requests=6)
    return config


@pytest.fixture(scope="module")
def cut_gguf(tmp_path_factory) -> Path:
    whole = Path(resolve_path(BUNDLED)).read_bytes()
    cut = tmp_path_factory.mktemp("faults") / "cut-short.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    return cut


@pytest.fixture(scope="module", params=["graph", "single"])
def fcluster(request, cut_gguf):
    POOL.release()
    with ServeCluster(faults_config(request.param, cut_gguf), num_cpus=2, serve_local=request.param == "single") as c:
        yield c


@pytest.fixture(scope="module")
def client(fcluster):
    with httpx.Client(base_url=fcluster.url, timeout=180) as c:
        yield c


def chat(model: str, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6, **kw}


def replicas() -> dict[str, set[tuple[str, int]]]:
    """Each deployment's running replicas as (replica id, pid): unchanged means none was restarted."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    deployments = details["applications"][APP]["deployments"]
    return {name: {(r["replica_id"], r["pid"]) for r in dep.get("replicas") or [] if "RUNNING" in str(r["state"])}
            for name, dep in deployments.items()}


def assert_answers(client, model: str) -> None:
    r = client.post("/v1/chat/completions", json=chat(model))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model and r.json()["usage"]["completion_tokens"] >= 1


def test_a_corrupt_gguf_is_a_503_naming_the_cause_and_the_others_keep_serving(fcluster, client, cut_gguf):
    assert_answers(client, GOOD_A)
    before = replicas()
    failures = []
    for i in range(6):
        started = time.monotonic()
        r = client.post("/v1/chat/completions", json=chat(CUT))
        failures.append((time.monotonic() - started, r))
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "model_load_failed" and error["type"] == "server_error"
        assert f"model '{CUT}' could not be loaded (pool '{POOL_NAME}')" in error["message"], error
        assert "cut-short.gguf" in error["message"] and "corrupted or incomplete" in error["message"], error
        assert str(cut_gguf.parent) not in error["message"]  # the file by its name only
        assert int(r.headers["Retry-After"]) > 0
        if i % 2:  # the good model answers between the failures
            assert_answers(client, GOOD_A)
    # Each replica reads the file once and then answers from what it remembers, at once.
    remembered = [(s, r) for s, r in failures if "failed " in r.json()["error"]["message"]
                  and " s ago" in r.json()["error"]["message"]]
    assert len(remembered) >= len(failures) - 2, [r.json()["error"]["message"] for _, r in failures]
    assert all(s < 10 for s, _ in remembered), [s for s, _ in remembered]
    # A stream gets the failure too, as an error in the protocol's shape, and ends.
    with client.stream("POST", "/v1/chat/completions", json=chat(CUT, stream=True)) as r:
        body = r.read().decode()
    if r.status_code == 200:  # headers already sent (keep-alive): the error is the stream's last event
        chunks, events = sse_json(body)
        assert chunks and chunks[-1].get("error", {}).get("code") == "model_load_failed", body[-400:]
    else:
        assert r.status_code == 503 and "corrupted or incomplete" in body
    assert_answers(client, GOOD_A)
    assert replicas() == before  # nothing crashed or restarted
    assert client.get("/health").status_code == 200


def _pool_states() -> dict[str, dict[str, str]]:
    """Each pool replica's published model states (deployments/pool_status.py), by replica id."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    from app.api import strict_json
    from deployments.model_status import NAMESPACE

    prefix = f"pool-state/{APP}/{pool_deployment_name(POOL_NAME)}/"
    out = {}
    for key in _internal_kv_list(prefix, namespace=NAMESPACE):
        key = key.decode() if isinstance(key, bytes) else key
        raw = _internal_kv_get(key, namespace=NAMESPACE)
        if raw:
            out[key[len(prefix):]] = strict_json.loads(raw)
    return out


def _holding(model: str, state: str) -> list[str]:
    running = {rid for rid, _ in replicas().get(pool_deployment_name(POOL_NAME), set())}
    return [rid for rid, states in _pool_states().items() if rid in running and states.get(model) == state]


def test_a_replica_killed_mid_load_loses_only_its_own_requests(fcluster, client):
    if fcluster.topology != "graph":
        pytest.skip("one pool replica in the single topology: the Ingress itself")
    import ray

    deployment = pool_deployment_name(POOL_NAME)
    assert wait_for(lambda: len(replicas().get(deployment, ())) == 2, 60), replicas()
    # GOOD_A on one replica, the survivor (the previous test loaded it there), the other holding nothing: Serve
    # routes GOOD_A's stream to the survivor, and the cold GOOD_B to the replica with the fewest models.
    assert_answers(client, GOOD_A)
    holder = wait_for(lambda: _holding(GOOD_A, "loaded"), 30, every=0.2)
    assert holder and len(holder) == 1, _pool_states()
    survivor = holder[0]
    running = {rid for rid, _ in replicas()[deployment]}
    others = [states for rid, states in _pool_states().items() if rid != survivor and rid in running]
    assert others and not any(s == "loaded" for states in others for s in states.values()), _pool_states()
    cold = GOOD_B
    time.sleep(2)  # Serve's routers hear which models each replica holds

    # A long stream on the survivor's model, under way before the kill.
    stream_result: dict = {}
    first_chunk = threading.Event()

    def stream_survivor() -> None:
        with httpx.Client(base_url=fcluster.url, timeout=300) as c, c.stream(
                "POST", "/v1/chat/completions",
                json=chat(GOOD_A, stream=True, max_tokens=160, logit_bias=NO_END,
                          stream_options={"include_usage": True})) as r:
            parts = []
            for piece in r.iter_text():
                parts.append(piece)
                if "data: {" in piece:
                    first_chunk.set()
            stream_result.update(status=r.status_code, body="".join(parts))
        first_chunk.set()

    # The request that waits on the load that dies.
    waiting: dict = {}

    def wait_on_load() -> None:
        started = time.monotonic()
        with httpx.Client(base_url=fcluster.url, timeout=300) as c:
            r = c.post("/v1/chat/completions", json=chat(cold))
        waiting.update(status=r.status_code, body=r.json(), seconds=time.monotonic() - started)

    streamer = threading.Thread(target=stream_survivor)
    streamer.start()
    assert first_chunk.wait(120)
    loader = threading.Thread(target=wait_on_load)
    loader.start()
    loading = wait_for(lambda: _holding(cold, "loading"), 60, every=0.02)
    assert loading, f"{cold} never seen loading: {_pool_states()}"
    victim = loading[0]
    assert victim != survivor, "Serve routed the cold model to the replica that holds the other one"
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{deployment}#{victim}", namespace="serve"), no_restart=False)

    loader.join(300)
    assert not loader.is_alive(), "the request waiting on the killed replica's load hung"
    assert waiting["status"] == 503, waiting
    assert waiting["body"]["error"]["type"] == "server_error" and waiting["body"]["error"]["code"], waiting
    streamer.join(300)
    assert not streamer.is_alive()
    assert stream_result["status"] == 200
    chunks, events = sse_json(stream_result["body"])
    assert events[-1] == "[DONE]" and not any("error" in c for c in chunks), stream_result["body"][-400:]
    # Whole: every token of it (a chunk may carry several tokens, so they are counted by its usage, not chunks).
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 160, chunks[-1]
    for _ in range(3):
        assert_answers(client, GOOD_A)
    assert any(rid == survivor for rid, _ in replicas()[deployment])

    # Serve replaces the killed replica, and the model whose load died loads again.
    assert wait_for(lambda: len(replicas().get(deployment, ())) == 2 and all(
        rid != victim for rid, _ in replicas()[deployment]), 180), replicas()
    assert wait_for(lambda: client.post("/v1/chat/completions", json=chat(cold)).status_code == 200, 120)
    assert _holding(cold, "loaded") or wait_for(lambda: _holding(cold, "loaded"), 30)
