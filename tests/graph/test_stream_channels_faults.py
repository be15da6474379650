"""The graph's data plane under many concurrent streams (app/transport/stream_channels.py): cancellation, a client
that stops reading, Serve's back-pressure, and replicas killed mid-stream, on a cluster of its own (graph
topology: every stream's items reach the ChatProcessor and the Ingress over the stream channels)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.serve_harness import MODEL, ServeCluster, load_config, sse_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a cluster of its own, replicas killed
KEY = "sk-test-" + "c" * 24
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL_DEPLOYMENT = deployment_name(MODEL)
SLOTS = 8
STREAMS = 24


@pytest.fixture(scope="module")
def ccluster():
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 4096, "n_seq_max": SLOTS}], "auth": {"required": True}},
        "deployments": [{"name": MODEL_DEPLOYMENT, "max_ongoing_requests": SLOTS, "max_queued_requests": 40}],
    }]})
    with ServeCluster(config, num_cpus=2, env={"LLAMARAY_API_KEYS": KEY}) as c:
        yield c


def body(max_tokens: int, seed: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Tell me story number {seed}."}],
            "max_tokens": max_tokens, "stream": True, "seed": seed, "temperature": 1.0, "min_p": 0.0, "top_k": 0}


def info(c: ServeCluster, name: str) -> dict:
    return c.handle(name).replica_info.remote().result()


def wait_idle(c: ServeCluster, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = c.model_stats(MODEL)
        if (s["running"] == 0 and s["waiting"] == 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.2)


async def read_stream(client: httpx.AsyncClient, payload: dict, *, stop_after: int | None = None) -> dict:
    """Reads one SSE stream: its data events, or only `stop_after` of them before disconnecting."""
    events: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": json.loads(await r.aread())}
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                if stop_after is not None and len(events) >= stop_after:
                    return {"status": 200, "events": events, "dropped": True}
    return {"status": 200, "events": events}


def run(coro):
    return asyncio.run(coro)


def client(c: ServeCluster) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=c.url, headers=AUTH, timeout=httpx.Timeout(180.0),
                             limits=httpx.Limits(max_connections=64))


def whole(result: dict, max_tokens: int) -> None:
    chunks, events = sse_json("\n".join(f"data: {e}\n" for e in result["events"]))
    assert events[-1] == "[DONE]", events[-3:]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert text


def test_many_streams_half_cancelled_the_rest_whole_and_every_slot_freed(ccluster):
    before = info(ccluster, "Ingress")["channels"].get("frames_received", 0)

    async def main():
        async with client(ccluster) as c:
            keep = [read_stream(c, body(48, i)) for i in range(STREAMS // 2)]
            drop = [read_stream(c, body(2000, 100 + i), stop_after=3) for i in range(STREAMS // 2)]
            return await asyncio.gather(*keep, *drop)

    results = run(main())
    kept, dropped = results[:STREAMS // 2], results[STREAMS // 2:]
    for r in kept:
        assert r["status"] == 200, r
        whole(r, 48)
    assert all(r["status"] == 200 and r.get("dropped") for r in dropped)
    # The dropped streams' generations were cancelled through their calls: nothing keeps decoding 2000 tokens.
    s = wait_idle(ccluster, timeout=60)
    assert s["running"] == 0 and s["waiting"] == 0, s
    assert info(ccluster, "Ingress")["channels"]["frames_received"] > before


def test_a_client_that_stops_reading_holds_up_no_other_stream(ccluster):
    async def main():
        async with client(ccluster) as c, c.stream("POST", "/v1/chat/completions", json=body(600, 7)) as stuck:
            assert stuck.status_code == 200
            t0 = time.monotonic()
            others = await asyncio.gather(*(read_stream(c, body(32, 200 + i)) for i in range(SLOTS - 1)))
            return others, time.monotonic() - t0

    others, elapsed = run(main())
    for r in others:
        assert r["status"] == 200, r
        whole(r, 32)
    assert elapsed < 120, elapsed
    assert wait_idle(ccluster)["running"] == 0


def test_back_pressure_past_the_queue_is_a_fast_503_while_accepted_streams_complete(ccluster):
    many = SLOTS + 40 + 16  # slots, Serve's queue, then more

    async def main():
        async with client(ccluster) as c:
            return await asyncio.gather(*(read_stream(c, body(16, 300 + i)) for i in range(many)))

    results = run(main())
    ok = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    assert ok and refused, [r["status"] for r in results]
    for r in refused:
        assert r["status"] == 503 and r["body"]["error"]["code"] == "overloaded", r
    for r in ok:
        whole(r, 16)
    assert wait_idle(ccluster)["running"] == 0


@pytest.mark.parametrize("victim", ["model", "ChatProcessor"])
def test_a_replica_killed_under_many_streams_ends_each_with_an_error_and_the_graph_recovers(ccluster, victim):
    name = MODEL_DEPLOYMENT if victim == "model" else "ChatProcessor"
    pid = info(ccluster, name)["pid"]

    async def main():
        async with client(ccluster) as c:
            first_chunks = asyncio.Queue()

            async def watched(i):
                events: list[str] = []
                async with c.stream("POST", "/v1/chat/completions", json=body(3000, 400 + i)) as r:
                    if r.status_code != 200:
                        return {"status": r.status_code}
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[len("data: "):])
                            if len(events) == 2:
                                first_chunks.put_nowait(i)
                return {"status": 200, "events": events}

            tasks = [asyncio.create_task(watched(i)) for i in range(SLOTS)]
            async with asyncio.timeout(120):
                for _ in range(SLOTS):
                    await first_chunks.get()
            os.kill(pid, signal.SIGKILL)
            async with asyncio.timeout(120):  # none hangs
                return await asyncio.gather(*tasks)

    results = run(main())
    for r in results:
        assert r["status"] == 200
        events = r["events"]
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        last = json.loads(events[-2])
        assert last["error"]["code"] == "replica_unavailable", last
    assert ccluster.wait_healthy(180)
    deadline, codes = time.monotonic() + 120, []
    while time.monotonic() < deadline and 200 not in codes:
        r = httpx.post(f"{ccluster.url}/v1/chat/completions", headers=AUTH, timeout=60,
                       json={**body(4, 1), "stream": False})
        codes.append(r.status_code)
        if r.status_code != 200:
            time.sleep(1)
    assert codes[-1] == 200 and set(codes) <= {200, 503, 504}, codes
    assert info(ccluster, name)["pid"] != pid
