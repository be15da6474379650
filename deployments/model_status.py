"""Each model replica's engine state (ready, loading, unavailable and why), published in Ray's GCS
key-value store, where the Ingress reads it for /health without sending anything through a replica's
request queue (a saturated replica answers a `stats` call only after its queue, and a flood of probes
would fill that queue). Keys are per replica; the reader keeps only those of replicas Serve reports
running, so a dead replica's key is ignored until it is overwritten or deleted."""

from __future__ import annotations

import logging

from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_list, _internal_kv_get, _internal_kv_put

from app.api import strict_json
from app.serving.models import ModelState

log = logging.getLogger("ray.serve")
NAMESPACE = "llamaray"


def _prefix(app: str, deployment: str) -> str:
    return f"model-state/{app}/{deployment}/"


def publish(app: str, deployment: str, replica_id: str, state: ModelState) -> None:
    try:
        _internal_kv_put(_prefix(app, deployment) + replica_id,
                         strict_json.dumps({"state": state.state, "reason": state.reason},
                                           compact=False, ensure_ascii=True), overwrite=True,
                         namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001 - /health then reads the replica as loading; serving goes on
        log.warning("llamaray: could not publish the model state: %s", exc)


def withdraw(app: str, deployment: str, replica_id: str) -> None:
    try:
        _internal_kv_del(_prefix(app, deployment) + replica_id, namespace=NAMESPACE)
    except Exception:  # noqa: BLE001 - the process is going away; a stale key is ignored by readers
        pass


def read(app: str, deployment: str) -> dict[str, ModelState]:
    """Replica id -> its published state."""
    prefix = _prefix(app, deployment)
    out = {}
    for key in _internal_kv_list(prefix, namespace=NAMESPACE):
        key = key.decode() if isinstance(key, bytes) else key
        raw = _internal_kv_get(key, namespace=NAMESPACE)
        if raw:
            value = strict_json.loads(raw)
            out[key[len(prefix):]] = ModelState(value["state"], value.get("reason"))
    return out
