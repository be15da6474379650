"""The Ray facts about where model replicas run, for the graph's Ingress: each model deployment's
per-replica request, running replicas and replicas still waiting for resources (from Serve's controller),
the alive nodes' total and free resources,
whether an autoscaler can add nodes (the placement watch), and each model's state for /health. The
decisions and their wording are plain Python in app/ops/placement.py."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Any

import ray
from ray._private import ray_constants
from ray.experimental.internal_kv import _internal_kv_get
from ray.serve.context import _get_global_client

from app.api.errors import service_unavailable
from app.config.spec import ModelSpec, deployment_name
from app.ops.placement import fits, unplaceable_message, waiting_message
from app.serving.models import LOADING, READY, ModelState

from . import model_status

logger = logging.getLogger("ray.serve")

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


def free_resources() -> list[dict[str, float]]:
    """Resources no actor or task holds now, per alive node."""
    from ray._private.state import available_resources_per_node

    return [{k: float(v) for k, v in res.items()} for res in available_resources_per_node().values()]


def deployment_placement(app_name: str, names: list[str]) -> dict[str, tuple[dict[str, float], int, int]]:
    """Per deployment: the resources one replica reserves, how many replicas run, and how many wait for Ray
    to give them a node (starting, with no node yet: a placed replica that is still loading has one)."""
    details = _get_global_client().get_serve_details()
    app = (details.get("applications") or {}).get(app_name) or {}
    out = {}
    for name in names:
        dep = (app.get("deployments") or {}).get(name)
        if dep is None:
            continue
        request = {k: float(v) for k, v in (dep.get("required_resources") or {}).items() if float(v) > 0}
        replicas = dep.get("replicas") or []
        running = sum(1 for r in replicas if _running(r.get("state")))
        waiting = sum(1 for r in replicas if _starting(r.get("state")) and not r.get("node_id"))
        out[name] = (request, running, waiting)
    return out


class PlacementWatch:
    """Every few seconds while a model deployment has no running replica: can any node hold one? If not,
    and no autoscaler can add such a node, say why once in the log, refuse the model's requests at once
    (instead of queueing them until their deadline) and give the reason to /health. The same when nodes could
    hold one but the other replicas hold what it needs (a config larger than the cluster): its replica has
    waited for a node over two checks and no node has its request free."""

    def __init__(self, app_name: str, specs: list[ModelSpec]) -> None:
        self.app_name = app_name
        self.names = {deployment_name(spec.id): spec.id for spec in specs}
        self.unplaced: dict[str, str] = {}  # model id -> why
        self._said: set[str] = set()
        self._short: set[str] = set()  # waiting, with no node that has its request free, at the last check
        self.checks = 0  # completed checks (tests wait for more, rather than for a fixed time)
        threading.Thread(target=self._watch, name="llamaray-placement", daemon=True).start()

    def admit(self, model_id: str) -> None:
        if model_id in self.unplaced:
            raise service_unavailable(self.unplaced[model_id], code="model_unplaceable")

    def _watch(self) -> None:
        while True:
            try:
                waiting = self._check()
            except Exception as exc:  # noqa: BLE001 - controller busy or gone: try again later
                logger.debug("placement check failed: %s", exc)
                waiting = True
            time.sleep(5 if waiting else 30)

    def _check(self) -> bool:
        placement = deployment_placement(self.app_name, list(self.names))
        pending = {n: (req, waiting) for n, (req, running, waiting) in placement.items() if running == 0}
        unplaced: dict[str, str] = {}
        short: set[str] = set()
        if pending:
            nodes, can_add = node_resources(), autoscaler_can_add_nodes()
            free = free_resources() if not can_add else []
            for name, (request, waiting) in pending.items():
                model_id = self.names[name]
                why = None if can_add else unplaceable_message(model_id, name, request, nodes)
                if why is None and not can_add and waiting and not any(fits(request, n) for n in free):
                    short.add(name)  # said only when still so at the next check: resources may be on their way back
                    if name in self._short:
                        why = waiting_message(model_id, name, request, nodes, free)
                if why is not None:
                    unplaced[model_id] = why
                    if model_id not in self._said:
                        logger.error("llamaray: %s", why)
                elif can_add and not any(fits(request, n) for n in nodes) and model_id not in self._said:
                    logger.warning("llamaray: %s waits for a node that can hold a replica (%s): no node has it "
                                   "now; the autoscaler may be launching one (minutes)", name, request)
                else:
                    continue
                self._said.add(model_id)
        self._short = short
        self.unplaced = unplaced
        self.checks += 1
        return bool(pending)


def cluster_model_states(app_name: str, specs: list[ModelSpec], unplaced: dict[str, str]) -> dict[str, ModelState]:
    """Each model's state from Serve's controller (its deployment's replicas) and the states its running
    replicas published (model_status): ready when one running replica serves, or when the deployment is
    healthy with no replica at all (scaled to zero: the first request waits for one)."""
    details = _get_global_client().get_serve_details()
    deployments = ((details.get("applications") or {}).get(app_name) or {}).get("deployments") or {}
    out = {}
    for spec in specs:
        name = deployment_name(spec.id)
        if spec.id in unplaced:
            out[spec.id] = ModelState("unavailable", unplaced[spec.id])
            continue
        dep = deployments.get(name) or {}
        running = [r.get("replica_id") for r in dep.get("replicas") or [] if _running(r.get("state"))]
        if not running:
            healthy = str(dep.get("status")).rsplit(".", 1)[-1] == "HEALTHY"
            out[spec.id] = READY if healthy and not dep.get("replicas") else LOADING
            continue
        published = model_status.read(app_name, name)
        states = [published[r] for r in running if r in published]
        if any(s.ready for s in states):
            out[spec.id] = READY
        elif states and len(states) == len(running):
            # What most needs saying: a replica that cannot serve, then one still downloading.
            out[spec.id] = next((s for s in states if s.failing),
                                next((s for s in states if s.state == "downloading"), states[0]))
        else:
            out[spec.id] = LOADING
    return out


def _running(state: Any) -> bool:
    return str(state) in ("RUNNING", "ReplicaState.RUNNING")


def _starting(state: Any) -> bool:
    return str(state) in ("STARTING", "ReplicaState.STARTING")
