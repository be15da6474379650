"""The Ray facts behind a placement message: each model deployment's per-replica request and running
replicas (from Serve's controller), the alive nodes' total resources, and whether an autoscaler can add
nodes. The decision and its wording are plain Python in app/placement.py."""

from __future__ import annotations

import json
import re

import ray
from ray._private import ray_constants
from ray.experimental.internal_kv import _internal_kv_get
from ray.serve.context import _get_global_client

# Without an autoscaler (`ray.init()`, `ray start` by hand), Ray's monitor runs a read-only one whose
# node types mirror the existing nodes, named node_<node id>.
_READONLY_NODE_TYPE = re.compile(r"^node_[0-9a-f]+$")


def autoscaler_can_add_nodes() -> bool:
    """An autoscaler with its own node types runs (`ray up` cluster, KubeRay in-tree autoscaling)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2(fetch_from_server=True):
        return True  # v2's status does not list its node types: assume it may add one
    raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    if not raw:
        return False
    report = json.loads(raw).get("autoscaler_report") or {}
    types = set((report.get("node_type_mapping") or {}).values())
    types |= set(report.get("active_nodes") or {}) | set(report.get("pending_launches") or {})
    return any(not _READONLY_NODE_TYPE.match(t) for t in types)


def node_resources() -> list[dict[str, float]]:
    """Total resources of each alive node."""
    return [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]


def deployment_placement(app_name: str, names: list[str]) -> dict[str, tuple[dict[str, float], int]]:
    """Per deployment: the resources one replica reserves, and how many replicas run."""
    details = _get_global_client().get_serve_details()
    app = (details.get("applications") or {}).get(app_name) or {}
    out = {}
    for name in names:
        dep = (app.get("deployments") or {}).get(name)
        if dep is None:
            continue
        request = {k: float(v) for k, v in (dep.get("required_resources") or {}).items() if float(v) > 0}
        running = sum(1 for r in dep.get("replicas") or [] if str(r.get("state")) in ("RUNNING", "ReplicaState.RUNNING"))
        out[name] = (request, running)
    return out
