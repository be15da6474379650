"""The cluster remembers (app/kvstore through app/engine/kv_placement.py), through a real local Ray Serve in both
topologies: a model replica killed and replaced (the Ingress that holds the engine, in `make run`'s shape) answers
its first long prompt by restoring the preamble its predecessor prefilled from the node's disk; a cluster on
"another node" (a KV folder of its own, the same fsspec store) restores it from the cluster's store. Clients see it
as `cached_tokens`. Replica kills and clusters of their own: make test-slow."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

from tests.support.preamble_chat import ask_after_preamble
from tests.support.serve_harness import MODEL, POOL, SHAPES, ServeCluster, load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

def tiers(cluster) -> dict:
    return cluster.model_stats(MODEL)["kv_tiers"]["tiers"]


def wait_for(check, what: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # noqa: BLE001 - a replica coming back answers with errors meanwhile
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s}s (last: {last!r})")


def model_pid(cluster) -> int:
    return cluster.model_stats(MODEL)["pid"]


def test_a_replaced_model_replica_restores_the_preamble_from_disk(cluster):
    first = ask_after_preamble(cluster, "Where is parcel 17?")
    preamble = first["prompt_tokens"] - 20
    wait_for(lambda: tiers(cluster)["disk"]["saves"] >= 1, "the preamble saved to the node's disk")
    old = model_pid(cluster)
    os.kill(old, signal.SIGKILL)  # graph: the LlamaModel replica; single: the Ingress that holds the engine
    wait_for(lambda: cluster.healthy() and model_pid(cluster) != old, "a replacement serving")
    usage = ask_after_preamble(cluster, "Can I get a refund for order 5?")
    assert usage["prompt_tokens_details"]["cached_tokens"] >= preamble, usage
    assert tiers(cluster)["disk"]["hits"] == 1


def small_config(shape: str, store: str) -> dict:
    overlays = ["configs/local-cpu.yaml"] + (["configs/local-graph.yaml"] if shape == "graph" else [])
    return load_config(*overlays, {"applications": [{"name": "llamaray", "args": {"models": [
        {"id": MODEL, "n_ctx": 2048, "n_seq_max": 2, "kv_cache": {"store": store}}]}}]})


@pytest.mark.parametrize("shape", SHAPES)
def test_another_node_restores_the_preamble_from_the_clusters_store(shape):
    POOL.release()
    store = f"file://{tempfile.mkdtemp(prefix='llamaray-kv-store-')}"
    with ServeCluster(small_config(shape, store), num_cpus=2 if shape == "single" else 4,
                      serve_local=shape == "single") as first:
        usage = ask_after_preamble(first, "Where is parcel 17?")
        wait_for(lambda: tiers(first)["cluster"]["saves"] >= 1, "the preamble saved to the cluster's store")
    with ServeCluster(small_config(shape, store), num_cpus=2 if shape == "single" else 4,
                      serve_local=shape == "single") as second:  # another node: a KV folder of its own
        assert tiers(second)["disk"]["entries"] == 0
        again = ask_after_preamble(second, "What is the address of order 9?")
        assert again["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 20, again
        stats = tiers(second)
        assert stats["cluster"]["hits"] == 1 and stats["disk"]["hits"] == 0
        wait_for(lambda: tiers(second)["disk"]["entries"] >= 1, "the restored state kept on this node's disk")
