"""Two Ray nodes on this machine, each with a KV folder of its own (LLAMARAY_KV_CACHE in each node's environment, as
each node of a cluster has its own disk) and no cluster store; a model with one replica on each. A conversation's
replica is killed and replaced on the same node: the conversation's next turn goes to the replacement, which restores
the preamble from its node's disk, and not to the replica on the other node, which would prefill it (the prefix
router's node records, app/routing/prefix_routing.py: the route decision `node`). Without node records the two
replicas are alike to the router (both idle, neither holding the prefix in memory) and load decides."""

from __future__ import annotations

import httpx
import pytest

from app.config.spec import deployment_name
from tests.support.preamble_chat import ask_after_preamble
from tests.support.prometheus import series, total
from tests.support.serve_harness import APP, MODEL, ServeCluster, free_port, load_config, ray_nodes
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DEPLOYMENT = deployment_name(MODEL)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    folders = {name: tmp_path_factory.mktemp(f"kv-{name}") for name in ("node_a", "node_b")}
    ports = {name: free_port() for name in folders}
    with ray_nodes({name: {"LLAMARAY_KV_CACHE": str(folder)} for name, folder in folders.items()}, ports) as cluster:
        yield cluster, folders, ports


def model_replicas() -> dict[str, str]:
    """The model's live replicas, replica id -> node id, from Ray's actor table (the GCS; the dashboard's state API is
    off in these clusters)."""
    from ray._private import state

    prefix = f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#"
    return {a["Name"][len(prefix):]: a["Address"]["NodeID"] for a in state.actors().values()
            if a["State"] == "ALIVE" and a["Name"].startswith(prefix)}


def two_live(without: str = "") -> dict[str, str] | None:
    """Both of the model's replicas, once two are alive and `without` is not one of them."""
    live = model_replicas()
    return live if len(live) == 2 and without not in live else None


def node_decisions(ports: dict[str, int]) -> float:
    """Route decisions `node` on both nodes (the router runs in the ChatProcessor, wherever Ray placed it)."""
    lines = []
    for port in ports.values():
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        lines += [ln for ln in series(text, "ray_llamaray_route_decisions_total") if 'reason="node"' in ln]
    return total(lines)


def test_a_replaced_replica_gets_its_conversation_back_and_restores_it_from_its_nodes_disk(two_nodes):
    import ray

    cluster, folders, ports = two_nodes
    node_ids = {cluster.head_node.node_id: "node_a", **{n.node_id: "node_b" for n in cluster.worker_nodes}}
    config = load_config("configs/local-cpu.yaml", "configs/local-graph.yaml", {"applications": [{
        "name": "llamaray",
        "args": {"models": [{"id": MODEL, "n_ctx": 2048, "n_seq_max": 2, "n_threads": 1}]},
        "deployments": [{"name": DEPLOYMENT, "max_replicas_per_node": 1,
                         "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                         "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}}],
    }]})
    with ServeCluster(config, address=cluster.address) as serve:
        before = wait_for(lambda: two_live(), 120)
        assert before and {node_ids[n] for n in before.values()} == {"node_a", "node_b"}, before
        first = ask_after_preamble(serve, "Where is parcel 17?", timeout=180)
        preamble = first["prompt_tokens"] - 20
        saved = wait_for(lambda: [n for n, f in folders.items() if any(f.rglob("*.kv"))], 120)
        assert saved and len(saved) == 1, [sorted(map(str, f.rglob("*"))) for f in folders.values()]  # the preamble on one node's disk: the other replica never saw it
        victim = next(r for r, node in before.items() if node_ids[node] == saved[0])
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#{victim}", namespace="serve"), no_restart=True)
        after = wait_for(lambda: two_live(without=victim), 180)
        assert after, f"no replacement for {victim}: {model_replicas()}"
        replacement = {r: n for r, n in after.items() if r not in before}
        # One replica a node: the replacement takes the victim's node.
        assert [node_ids[n] for n in replacement.values()] == saved, replacement
        assert wait_for(lambda: serve.replicas(DEPLOYMENT).get("RUNNING") == 2 and serve.healthy(), 180)

        again = ask_after_preamble(serve, "Can I get a refund for order 5?", timeout=180)
        assert again["prompt_tokens_details"]["cached_tokens"] >= preamble, again
        assert wait_for(lambda: node_decisions(ports) >= 1, 30), [
            ln for port in ports.values() for ln in series(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text,
                                                           "ray_llamaray_route_decisions_total")]
        # The other node's disk holds nothing of it: its replica never prefilled it.
        assert not any(p.is_file() for n, f in folders.items() if n != saved[0] for p in f.rglob("*.kv"))
