"""Where stored responses live on a cluster: one BoundedResponseStore (app/openai_responses/store.py) in a
Ray Serve *deployment-scoped actor* of the deployment that runs the processing (ChatProcessor in topology
`graph`, the Ingress in `single`), reached by each of its replicas through `ActorResponseStore`.

Why that and not the alternatives:
- Not in a replica: a replica that crashes, fails its health check or is scaled down would take the
  responses it stored with it, and a request continuing one lands on any replica.
- A deployment-scoped actor (Ray Serve's `deployment_actors`, Ray 2.60, pinned) is made by Serve's
  controller before the deployment's replicas start, shared by all of them, health-checked and recreated
  by the controller, and killed with the deployment: when the app is deleted, on `serve shutdown`, and on a
  redeploy that changes the app's code version (its args, import path or runtime env) once no replica of
  the old version is left. So nothing outlives the app, and nothing of ours has to clean up.
- A detached named actor (`get_if_exists`) would also survive redeploys, but it outlives the app: Serve
  has no hook for an app's deletion, so it would hold up to `response_store_bytes` until Ray itself stops.
- A Serve deployment with one replica would die with the app too, but each call would go through Serve's
  router and queue, and its replica count is one line of YAML away from splitting the store in two.

What is lost, as for any in-memory store: everything stored, when the actor itself dies (the controller
starts an empty one), when the app is redeployed with changed args, or when Ray stops.

Entries cross to the actor as their JSON bytes, encoded and decoded in the replicas (many) rather than in
the actor (one); the actor's methods are O(1) dictionary work, one at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.serve.config import DeploymentActorConfig

from app.api.errors import service_unavailable
from app.config.app_args import Limits
from app.openai_responses.store import BoundedResponseStore, decode_entry, encode_entry

from .actor_client import DeploymentActorClient

log = logging.getLogger("ray.serve")

STORE_ACTOR = "response_store"
"""The store's name among its deployment's actors (`serve.get_deployment_actor`); Ray names the actor
`SERVE_DEPLOYMENT_ACTOR::<app>::<deployment>::<code version>::response_store` in the `serve` namespace."""


@ray.remote
class ResponseStoreActor:
    """A BoundedResponseStore behind Ray calls: entries in and out as their JSON encoding."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float, key_entries: int | None = None,
                 key_bytes: int | None = None) -> None:
        self.store = BoundedResponseStore(max_entries, max_bytes, ttl_s, key_entries=key_entries,
                                          key_bytes=key_bytes)

    def put(self, owner: str | None, response_id: str, blob: bytes) -> bool:
        return self.store.put_blob(owner, response_id, blob)

    def get(self, owner: str | None, response_id: str) -> bytes | None:
        return self.store.get_blob(owner, response_id)

    def delete(self, owner: str | None, response_id: str) -> bool:
        return self.store.delete_blob(owner, response_id)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()


def store_enabled(limits: Limits) -> bool:
    return limits.response_store_entries > 0


def response_store_actors(limits: Limits) -> list[DeploymentActorConfig]:
    """The `deployment_actors` of the deployment that runs the processing: the store, unless storing is off."""
    if not store_enabled(limits):
        return []
    # num_cpus 0: a few dictionary operations per request, on whatever node has room.
    return [DeploymentActorConfig(name=STORE_ACTOR, actor_class=ResponseStoreActor, actor_options={"num_cpus": 0},
                                  init_kwargs={"max_entries": limits.response_store_entries,
                                               "max_bytes": limits.response_store_bytes,
                                               "ttl_s": limits.response_store_ttl_s,
                                               "key_entries": limits.response_store_key_entries,
                                               "key_bytes": limits.response_store_key_bytes})]


class ActorResponseStore:
    """app.openai_responses.store.ResponseStore over the store actor of this replica's deployment. The actor
    is looked up again after it died (the controller recreates it under the same name); while it is being
    recreated, a call fails with a 503 `response_store_unavailable`."""

    def __init__(self, lookup: Callable[[], Any] | None = None) -> None:
        self.actor = DeploymentActorClient(STORE_ACTOR, _unavailable, lookup)

    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> bool:
        return await self.actor.call("put", owner, response_id, encode_entry(entry))

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        blob = await self.actor.call("get", owner, response_id)
        return None if blob is None else decode_entry(blob)

    async def delete(self, owner: str | None, response_id: str) -> bool:
        return await self.actor.call("delete", owner, response_id)


def _unavailable(cause: BaseException) -> Exception:
    log.warning("llamaray: the response store is unavailable: %r", cause)
    return service_unavailable("The response store is restarting; retry shortly.", code="response_store_unavailable")
