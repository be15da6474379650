"""The Responses store in both topologies: one actor per app, held by the deployment that runs the processing
(the Ingress in `single`, the ChatProcessor in `graph`). An entry written into it is served by
GET /v1/responses/{id} to its owner only, outlives the restart of every replica that reaches it, and is
gone after DELETE. (Entries are written into the actor directly: creating one over HTTP is POST
/v1/responses's job.)"""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import ray

from app.openai_responses.store import encode_entry
from app.generation.caller import Caller
from deployments.response_store import STORE_ACTOR
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import APP, KEY_A, KEY_B
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # kills and waits for replicas: make test-slow

RESPONSE = {"id": "resp_store_test", "object": "response", "created_at": 1, "status": "completed",
            "model": "smollm2-135m", "output": [{"type": "message", "id": "msg_1", "status": "completed",
                                                 "role": "assistant",
                                                 "content": [{"type": "output_text", "text": "kept", "annotations": []}]}]}
PATH = f"/v1/responses/{RESPONSE['id']}"


def store_actor(holder: str):
    """The app's store actor, by the name Serve gives its deployment actors (one, held by `holder`)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].endswith(f"::{STORE_ACTOR}") and f"::{APP}::" in a["name"]]
    assert len(names) == 1, names
    assert f"::{APP}::{holder}::" in names[0], names[0]
    return ray.get_actor(names[0], namespace="serve")


def get(cluster, key: str) -> httpx.Response:
    return httpx.get(f"{cluster.url}{PATH}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_stored_response_outlives_replica_restarts(cluster):
    holder = "Ingress" if cluster.topology == "single" else "ChatProcessor"
    actor = store_actor(holder)
    owner = Caller.with_key(KEY_A.encode()).key_id
    entry = {"response": RESPONSE, "conversation": [{"role": "user", "content": "keep this"}]}
    assert ray.get(actor.put.remote(owner, RESPONSE["id"], encode_entry(entry))) is True

    r = get(cluster, KEY_A)
    assert r.status_code == 200 and r.json() == RESPONSE
    r = get(cluster, KEY_B)  # another key: the same 404 as an id never stored
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert_valid("ErrorResponse", r.json())
    r = httpx.delete(f"{cluster.url}{PATH}", headers={"Authorization": f"Bearer {KEY_B}"}, timeout=30)
    assert r.status_code == 404

    # Kill every replica between the client and the store: the Ingress, and in `graph` the ChatProcessor.
    restarted = ["Ingress"] if cluster.topology == "single" else ["Ingress", "ChatProcessor"]
    before = cluster.identities()
    for name in restarted:
        os.kill(before[name][1], signal.SIGKILL)

    def replaced_and_serving():
        try:
            now = cluster.identities()
        except Exception:  # noqa: BLE001 - a replica still starting: not yet
            return None
        if any(now[name][0] == before[name][0] for name in restarted) or not cluster.healthy():
            return None
        r = get(cluster, KEY_A)
        return (now, r) if r.status_code != 503 else None

    result = wait_for(replaced_and_serving, timeout=300, every=1)
    assert result is not None, f"replicas not replaced and serving: {cluster.identities()}"
    now, r = result
    assert all(now[name][1] != before[name][1] for name in restarted)
    assert r.status_code == 200 and r.json() == RESPONSE
    assert store_actor(holder)._actor_id == actor._actor_id  # the same actor, not a new empty one

    r = httpx.delete(f"{cluster.url}{PATH}", headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"id": RESPONSE["id"], "object": "response", "deleted": True}
    assert get(cluster, KEY_A).status_code == 404
    assert ray.get(actor.get.remote(owner, RESPONSE["id"])) is None
