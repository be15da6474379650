"""What each pool replica holds (model id -> loaded, loading, available), published in Ray's GCS key-value store
as model_status publishes a model replica's state, and read by the graph's Ingress for /v1/models and /health
without a call through a replica's queue."""

from __future__ import annotations

import logging

from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_list, _internal_kv_put
from ray.serve.context import _get_global_client

from app.api import strict_json
from app.serving.models import LOADING, READY, ModelState

from .model_status import NAMESPACE

log = logging.getLogger("ray.serve")


def _prefix(app: str, deployment: str) -> str:
    return f"pool-state/{app}/{deployment}/"


def publish(app: str, deployment: str, replica_id: str, states: dict[str, str]) -> None:
    try:
        _internal_kv_put(_prefix(app, deployment) + replica_id, strict_json.dumps(states, ensure_ascii=True),
                         overwrite=True, namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001 - /v1/models then reads the replica's models as available
        log.warning("llamaray: could not publish the pool's state: %s", exc)


def withdraw(app: str, deployment: str, replica_id: str) -> None:
    try:
        _internal_kv_del(_prefix(app, deployment) + replica_id, namespace=NAMESPACE)
    except Exception:  # noqa: BLE001 - the process is going away; readers keep running replicas' keys only
        pass


def merged(per_replica: list[dict[str, str]], models: list[str]) -> dict[str, str]:
    """A model is loaded when a replica holds it, loading when one loads it, else available."""
    out = {}
    for model in models:
        seen = {states.get(model) for states in per_replica}
        out[model] = "loaded" if "loaded" in seen else "loading" if "loading" in seen else "available"
    return out


def cluster_pool_states(app: str, pools: dict[str, list[str]]) -> tuple[dict[str, str], dict[str, ModelState]]:
    """For every pooled model: (its pool state over the pool's running replicas, its /health state: ready when
    its pool deployment has a running replica, or is healthy with none, as a model deployment)."""
    details = _get_global_client().get_serve_details()
    deployments = ((details.get("applications") or {}).get(app) or {}).get("deployments") or {}
    states: dict[str, str] = {}
    health: dict[str, ModelState] = {}
    for deployment, models in pools.items():
        dep = deployments.get(deployment) or {}
        running = {r.get("replica_id") for r in dep.get("replicas") or []
                   if str(r.get("state")) in ("RUNNING", "ReplicaState.RUNNING")}
        prefix = _prefix(app, deployment)
        published = []
        for key in _internal_kv_list(prefix, namespace=NAMESPACE):
            key = key.decode() if isinstance(key, bytes) else key
            raw = _internal_kv_get(key, namespace=NAMESPACE) if key[len(prefix):] in running else None
            if raw:
                published.append(strict_json.loads(raw))
        states.update(merged(published, models))
        healthy = str(dep.get("status")).rsplit(".", 1)[-1] == "HEALTHY"
        ready = READY if running or (healthy and not dep.get("replicas")) else LOADING
        health.update({m: ready for m in models})
    return states, health


def running_replicas(app: str, deployment: str) -> list[str]:
    """The ids of a deployment's running replicas, as Serve's controller lists them (what the admin routes send
    an unload or a pin to, one by one)."""
    details = _get_global_client().get_serve_details()
    dep = (((details.get("applications") or {}).get(app) or {}).get("deployments") or {}).get(deployment) or {}
    return [r["replica_id"] for r in dep.get("replicas") or []
            if str(r.get("state")) in ("RUNNING", "ReplicaState.RUNNING") and r.get("replica_id")]
