"""A pool through a real app of its own, in each topology: six copies of the bundled GGUF under different ids
in one pool with `max_models: 2` and one of them pinned. Graph: two LlamaPool replicas of one CPU each (the
machine's two cores), so Serve's multiplexed routing chooses among replicas; single: the Ingress's one pool.
Every model answers; /v1/models lists each with its state; a cold model's stream shows keep-alive comments
while it loads, then its answer; evictions reach Prometheus, and the pinned model is never evicted; Ollama's
`keep_alive` loads, pins and unloads a pooled model; a cold model whose pool's models are all kept busy claims one
(claim_after_s) and is served within room_wait_s."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from app.config.paths import resolve_path
from app.kvstore.key import file_sha256
from tests.support.prometheus import series, total
from tests.support.serve_harness import pool_deployments, BUNDLED, POOL, SHAPES, ServeCluster, free_port, load_config, sse_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PINNED = "pool-a"
MODELS = [PINNED, "pool-b", "pool-c", "pool-d", "pool-e", "pool-f"]  # the six
POOL_NAME = "tail"
CHECKED = "pool-d"
KEEPALIVE_S = 0.1
CLAIM_AFTER_S = 1.0  # room_wait_s stays 30 s: a cold request that never claimed would get its 503 only then


def pool_config(shape: str) -> dict:
    config = load_config("configs/local-cpu.yaml")
    app = config["applications"][0]
    # Only the pool's models: each one thread, a small context, no model of its own deployment.
    app["args"]["models"] = [{"id": m, "model_path": BUNDLED, "pool": POOL_NAME, "n_ctx": 512, "n_seq_max": 2,
                              "n_threads": 1, "n_gpu_layers": 0} for m in MODELS]
    # One model checked against its sha256, as a remote one is fetched: its engine starts on a thread of its own
    # (app/replica/preparation.py), which wakes the pool's waiting load (deployments/pool.py).
    app["args"]["models"][MODELS.index(CHECKED)]["sha256"] = file_sha256(str(resolve_path(BUNDLED)))
    app["args"]["pools"] = [{"name": POOL_NAME, "max_models": 2, "pinned": [PINNED], "claim_after_s": CLAIM_AFTER_S}]
    app["args"]["limits"] = {"stream_keepalive_s": KEEPALIVE_S}
    app["args"]["topology"] = shape
    # 8: a replica's two busy models' requests (3 each, below) and the cold one all reach it
    app["deployments"] = pool_deployments(shape, POOL_NAME, max_ongoing_requests=8)
    return config


@pytest.fixture(scope="module", params=["graph", "single"])
def pcluster(request):
    assert set(SHAPES) == {"graph", "single"}
    POOL.release()
    with ServeCluster(pool_config(request.param), num_cpus=2, metrics_port=free_port(),
                      serve_local=request.param == "single") as c:
        yield c


@pytest.fixture(scope="module")
def client(pcluster):
    with httpx.Client(base_url=pcluster.url, timeout=120) as c:
        yield c


def chat(model: str, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6, **kw}


def states(client) -> dict[str, dict]:
    body = client.get("/v1/models").json()
    return {card["id"]: card for card in body["data"]}


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s}s (last: {last!r})")


def metric_lines(cluster, name: str) -> list[str]:
    text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).text
    return series(text, f"ray_{name}")


def test_models_are_listed_with_their_pool_and_state(client):
    cards = wait_for(lambda: (s := states(client)) and s[PINNED].get("state") == "loaded" and s, 30,
                     "the pinned model listed as loaded")
    assert set(cards) == set(MODELS)
    for model in MODELS:
        assert cards[model]["pool"] == POOL_NAME
        assert cards[model]["state"] in ("loaded", "loading", "available")
    assert {cards[m]["state"] for m in MODELS if m != PINNED} == {"available"}


def test_a_cold_models_stream_keeps_alive_while_it_loads_then_answers(client):
    assert states(client)["pool-b"]["state"] == "available"
    with client.stream("POST", "/v1/chat/completions", json=chat("pool-b", stream=True)) as r:
        assert r.status_code == 200
        body = r.read().decode()
    # Keep-alive comments come while the model loads, before its first token; the role's opening chunk may come
    # before them (the single topology sends it as soon as the request is accepted).
    lines = body.splitlines()
    first_token = next(i for i, line in enumerate(lines) if line.startswith("data: {") and
                       any(c["delta"].get("content") for c in json.loads(line[6:])["choices"]))
    assert ": keep-alive" in lines[:first_token], body[:400]
    chunks, events = sse_json(body)
    assert events[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert all(c["model"] == "pool-b" for c in chunks)
    # /v1/models reads the replicas' published states, refreshed at most once a second.
    wait_for(lambda: states(client)["pool-b"]["state"] == "loaded", 10, "pool-b listed as loaded")


def test_every_model_answers_and_evictions_reach_metrics(pcluster, client):
    for model in [*MODELS, *reversed(MODELS)]:  # 5 unpinned models through 1 free slot per replica
        r = client.post("/v1/chat/completions", json=chat(model))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == model and body["usage"]["completion_tokens"] >= 1
    evictions = wait_for(lambda: metric_lines(pcluster, "llamaray_pool_evictions_total"), 30, "eviction metrics")
    assert total(evictions) >= 1, evictions
    assert all(f'pool="{POOL_NAME}"' in ln for ln in evictions)
    assert not any(f'model="{PINNED}"' in ln for ln in evictions), evictions
    loads = wait_for(lambda: [ln for ln in metric_lines(pcluster, "llamaray_pool_loads_total")
                              if 'outcome="ok"' in ln], 30, "load metrics")
    loaded_models = {m for m in MODELS if any(f'model="{m}"' in ln for ln in loads)}
    assert loaded_models == set(MODELS)
    assert states(client)[PINNED]["state"] == "loaded"


def test_an_unknown_model_is_a_404_and_health_is_ok(client):
    r = client.post("/v1/chat/completions", json=chat("pool-z"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert client.get("/health").status_code == 200


# ---- the admin routes (app/pools/admin.py): the cluster runs without keys, so its local user is the admin ----

def admin(client, verb: str, **body) -> dict:
    r = client.post(f"/admin/models/{verb}", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_admin_load_pin_survives_lru_pressure_then_unload(client):
    # Unloading a pinned model unpins it (the config's pin included): each replica has both places free again.
    assert admin(client, "unload", model=PINNED)["state"] == "available"
    loaded = admin(client, "load", model="pool-c")
    assert loaded["state"] == "loaded" and loaded["replicas"], loaded
    assert admin(client, "load", model="pool-c")["state"] == "loaded"  # again: nothing to do
    wait_for(lambda: states(client)["pool-c"]["state"] == "loaded", 10, "pool-c listed as loaded")
    pinned = admin(client, "pin", model="pool-c", pinned=True)
    assert pinned["pinned"] and all(r["pinned"] for r in pinned["replicas"]), pinned
    holders = {r["replica"] for r in pinned["replicas"]}
    # LRU pressure: the other models, twice each (max_models 2: the holders keep one place free).
    for model in (PINNED, "pool-b", "pool-d", PINNED, "pool-b", "pool-d"):
        r = client.post("/v1/chat/completions", json=chat(model))
        assert r.status_code == 200, (model, r.text, client.get("/admin/models").text)
    listing = {c["id"]: c for c in client.get("/admin/models").json()["data"]}
    assert holders <= {r["replica"] for r in listing["pool-c"]["replicas"] if r["state"] == "loaded"}, listing
    unpinned = admin(client, "pin", model="pool-c", pinned=False)
    assert not unpinned["pinned"]
    gone = admin(client, "unload", model="pool-c")
    assert gone["state"] == "available" and gone["replicas"] == [], gone
    wait_for(lambda: states(client)["pool-c"]["state"] == "available", 10, "pool-c listed as available")
    repinned = admin(client, "pin", model=PINNED, pinned=True)  # pinned where it is held, loaded if nowhere
    assert repinned["state"] == "loaded" and repinned["pinned"], repinned


def test_admin_refusals(client):
    unknown = client.post("/admin/models/load", json={"model": "pool-z"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    malformed = client.post("/admin/models/pin", json={"model": "pool-a", "pinned": "yes"})
    assert malformed.status_code == 400
    page = client.post("/admin/models/unload", content=b'{"model": "pool-a"}',
                       headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert page.status_code == 403 and page.json()["error"]["code"] == "origin_not_allowed"


def test_ollamas_keep_alive_loads_pins_and_unloads_a_pooled_model(pcluster, client):
    """Ollama's `keep_alive` through the official client (app/ollama_api/keep_alive.py): a request without a prompt
    loads the model, a negative keep_alive pins it, 0 unloads it (here the local user of a server without keys may
    manage the pools, as an admin key may)."""
    import ollama

    api = ollama.Client(host=pcluster.url, timeout=120)

    def held(model: str) -> dict:
        return next(c for c in client.get("/admin/models").json()["data"] if c["id"] == model)

    assert api.generate(model="pool-e:latest").done_reason == "load"
    assert held("pool-e")["state"] == "loaded" and "pool-e:latest" in {m.model for m in api.ps().models}
    assert api.chat(model="pool-e", messages=[], keep_alive=-1).done_reason == "load"
    assert held("pool-e")["pinned"]
    reply = api.chat(model="pool-e", messages=[{"role": "user", "content": "Say hello."}], keep_alive=0,
                     options={"num_predict": 3})
    assert reply.eval_count == 3 and reply.done_reason == "length"
    unloaded = held("pool-e")
    assert (unloaded["state"], unloaded["pinned"], unloaded["replicas"]) == ("available", False, [])
    assert "pool-e:latest" not in {m.model for m in api.ps().models}
    assert api.generate(model="pool-e", keep_alive="0s").done_reason == "unload"


# ---- the KV a pooled model prefilled outlives its eviction (app/kvstore: the node's disk) ----------------------

PREAMBLE = "You answer questions about a library's opening hours and its rules. " * 24  # ~400 tokens


def test_a_model_evicted_and_loaded_again_restores_its_preamble_from_disk(client):
    def ask(question: str) -> dict:
        r = client.post("/v1/chat/completions", json={
            "model": "pool-f", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": question}]})
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    first = ask("When does it open on Monday?")
    assert first["prompt_tokens"] > 300
    assert admin(client, "unload", model="pool-f")["state"] == "available"  # its engine and memory gone
    again = ask("May I bring a dog?")  # loaded again, wherever Serve routes it on this node
    assert again["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 20, again


# ---- a cold model is not starved by busy ones (app/pools/manager.py: the claim for room) ---------------------

def claims(cluster) -> float:
    return total(metric_lines(cluster, "llamaray_pool_claims_total"))


def test_a_cold_model_claims_a_busy_one_and_is_served_before_room_wait_s(pcluster, client):
    """Every place of the pool held by a model whose requests never stop (three clients each, always one request
    on it): the cold model's request claims one after claim_after_s, that model's new requests wait, it is unloaded
    once the requests on it end, and the cold request is answered long before room_wait_s (30 s). The busy models'
    clients all get their answers (the claimed model's wait, then it comes back)."""
    replicas = 2 if pcluster.config["applications"][0]["args"]["topology"] == "graph" else 1
    for model in MODELS:  # every place free, nothing pinned
        admin(client, "unload", model=model)
    busy = MODELS[1:1 + 2 * replicas]

    def placed() -> bool:
        listing = {c["id"]: c for c in client.get("/admin/models").json()["data"]}
        held = [(m, r["replica"]) for m in busy for r in listing[m]["replicas"] if r["state"] == "loaded"]
        return {m for m, _ in held} == set(busy) and len(held) == len(busy)

    def place() -> bool:  # one at a time, a routing report (every second) apart: each to a replica with room
        for model in busy:
            admin(client, "load", model=model)
            time.sleep(1.2)
        return placed()
    wait_for(place, 90, f"{busy} loaded, one place each")

    stop, answers = threading.Event(), []

    def keep_busy(model: str, tokens: int) -> None:
        with httpx.Client(base_url=pcluster.url, timeout=120) as c:
            while not stop.is_set():
                r = c.post("/v1/chat/completions", json=chat(model, max_tokens=tokens))
                answers.append((model, r.status_code, r.text[:200]))

    clients = [threading.Thread(target=keep_busy, args=(m, t), daemon=True) for m in busy for t in (8, 12, 16)]
    for t in clients:
        t.start()
    try:
        wait_for(lambda: {m for m, status, _ in answers if status == 200} == set(busy), 60, "every busy model answering")
        before = claims(pcluster)
        t0 = time.monotonic()
        r = client.post("/v1/chat/completions", json=chat("pool-f"))
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "pool-f"
        assert took < 25, took  # room_wait_s is 30: it claimed, and did not wait for a busy model to go idle
    finally:
        stop.set()
        for t in clients:
            t.join(120)
    wait_for(lambda: claims(pcluster) >= before + 1, 30, "the claim counted")
    failed = [a for a in answers if a[1] != 200]
    assert not failed, failed[:3]
    admin(client, "pin", model=PINNED, pinned=True)  # as the module began
