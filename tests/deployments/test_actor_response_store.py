"""The replicas' client of the store actor, over a stand-in actor (no Ray started): entries cross as JSON
bytes, a handle to an actor that died is looked up again, and a store being recreated is a 503."""

from __future__ import annotations

import asyncio

import pytest
from ray import exceptions as ray_exc

from app.api.errors import APIError
from app.config.app_args import Limits
from deployments.response_store import STORE_ACTOR, ActorResponseStore, ResponseStoreActor, response_store_actors


class Method:
    def __init__(self, actor: "FakeActor", name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args):
        async def call():
            if self.actor.dead:
                raise ray_exc.ActorDiedError()
            self.actor.calls.append((self.name, args))
            return getattr(self.actor.inner, self.name)(*args)
        return call()


class FakeActor:
    """ResponseStoreActor's own code, called as Ray would (`.remote()` gives an awaitable)."""

    def __init__(self) -> None:
        self.inner = ResponseStoreActor.__ray_actor_class__(10, 1 << 20, 60.0)
        self.dead = False
        self.calls: list = []

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)


def test_entries_cross_as_json_bytes():
    actor = FakeActor()
    store = ActorResponseStore(lambda: actor)
    entry = {"response": {"id": "resp_1", "object": "response"}, "conversation": []}
    assert asyncio.run(store.put("a", "resp_1", entry)) is True
    name, (owner, rid, blob) = actor.calls[-1]
    assert (name, owner, rid) == ("put", "a", "resp_1") and isinstance(blob, bytes)
    assert asyncio.run(store.get("a", "resp_1")) == entry
    assert asyncio.run(store.get("b", "resp_1")) is None
    assert asyncio.run(store.delete("a", "resp_1")) is True
    assert asyncio.run(store.get("a", "resp_1")) is None


def test_a_dead_handle_is_looked_up_again():
    first, second = FakeActor(), FakeActor()
    actors = iter([first, second])
    store = ActorResponseStore(lambda: next(actors))
    assert asyncio.run(store.get("a", "r")) is None and store.actor.actor is first
    first.dead = True  # the controller replaced it: the next call reaches the new one
    assert asyncio.run(store.put("a", "r", {"response": {}})) is True
    assert store.actor.actor is second and second.calls[0][0] == "put"


def test_a_store_being_recreated_is_a_503():
    def missing():
        raise ValueError("Failed to look up actor")

    with pytest.raises(APIError) as info:
        asyncio.run(ActorResponseStore(missing).get("a", "r"))
    assert info.value.status == 503 and info.value.code == "response_store_unavailable"

    dead = FakeActor()
    dead.dead = True
    with pytest.raises(APIError) as info:
        asyncio.run(ActorResponseStore(lambda: dead).delete("a", "r"))
    assert info.value.status == 503


def test_the_store_actor_follows_the_limits():
    limits = Limits(response_store_entries=5, response_store_bytes=4096, response_store_ttl_s=30,
                    response_store_key_entries=3, response_store_key_bytes=2048)
    [config] = response_store_actors(limits)
    assert config.name == STORE_ACTOR and config.actor_options == {"num_cpus": 0}
    assert config.init_kwargs == {"max_entries": 5, "max_bytes": 4096, "ttl_s": 30.0, "key_entries": 3,
                                  "key_bytes": 2048}
    assert response_store_actors(Limits(response_store_entries=0)) == []
