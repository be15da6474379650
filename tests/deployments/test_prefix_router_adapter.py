"""The Ray Serve adapter (deployments/prefix_router.py) driven the way Serve's handle drives a
RequestRouter, with stand-in replicas (no Ray cluster): the prompt is read from the pending
GenerationRequest, loads come from the handle's queue-length cache or a probe, ranks come back best
first, and records follow the replicas Serve reports."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402
from ray.serve.request_router import PendingRequest, ReplicaID  # noqa: E402

from app.engine.jobs import CountPromptJob  # noqa: E402
from app.engine.params import GenerationRequest, InfillPrompt  # noqa: E402
from deployments.prefix_router import PoolAffinityRouter, PrefixAffinityRouter, prompt_of  # noqa: E402
from app.pools.manager import POOL_AHEAD, POOL_FREE, POOL_ROOM  # noqa: E402

DEP = DeploymentID(name="LlamaModel-m", app_name="llamaray")
SYSTEM = "".join(f"Sentence {i} of a long shared system prompt. " for i in range(60))


class StandIn:
    """What a router reads of a RunningReplica, plus the probe it answers."""

    def __init__(self, name: str, ongoing: int = 0, capacity: int = 4, models: tuple[str, ...] = (),
                 room: int | None = None, node: str | None = None) -> None:
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEP)
        self.node_id = node
        self.ongoing, self.max_ongoing_requests, self.probes = ongoing, capacity, 0
        self.multiplexed_model_ids = set(models)  # a pool replica's loaded models, as Serve reports them
        # A pool replica's routing stats (LlamaPool.record_routing_stats); {} before its first report.
        self.routing_stats = {} if room is None else {POOL_ROOM: room}

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        return self.ongoing


def pending(arg, n: int = 0) -> PendingRequest:
    return PendingRequest(args=[arg], kwargs={}, metadata=RequestMetadata(request_id=str(n), internal_request_id=str(n)))


def gen(prompt: str, scope: str = "") -> PendingRequest:
    return pending(GenerationRequest(request_id="r", prompt=prompt, cache_scope=scope))


def names(ranks) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


async def new_router(*replicas: StandIn, router_class=PrefixAffinityRouter, **kwargs) -> PrefixAffinityRouter:
    router = router_class(deployment_id=DEP, handle_source=DeploymentHandleSource.REPLICA,
                                  use_replica_queue_len_cache=True)
    router.initialize_state(**kwargs)
    router.update_replicas(list(replicas))
    for _ in range(200):  # let the probe that update_replicas starts fill the cache
        if all(router.replica_queue_len_cache.get(r.replica_id) is not None for r in replicas):
            break
        await asyncio.sleep(0.005)
    return router


def test_prompt_is_read_from_the_generation_request_only():
    async def run():  # a PendingRequest makes its future on the running loop
        assert prompt_of(gen("hello")) == ("hello", "")
        assert prompt_of(gen("hello", "key-1")) == ("hello", "key-1")
        assert prompt_of(pending("just text to tokenize")) is None
        assert prompt_of(pending(CountPromptJob("a prompt to count", []))) is None  # a `run` goes by load
        assert prompt_of(None) is None
        # A fill-in-the-middle prompt is matched by its parts in layout order: the other files first, which an
        # editor sends again as the text around its cursor changes.
        fim = GenerationRequest(request_id="f", prompt="", infill=InfillPrompt("def f", "\n", (("a.py", "x"),)))
        text, _ = prompt_of(pending(fim))
        assert text.startswith("a.py\nx") and "def f" in text

    asyncio.run(run())


def test_a_conversation_sticks_to_its_replica_and_leaves_it_when_busy():
    async def run():
        a, b = StandIn("a", ongoing=1), StandIn("b", ongoing=0)
        router = await new_router(a, b, min_match_chars=128)
        turn1 = SYSTEM + "user: first question"
        # nothing known yet: the less loaded replica, the other as the fallback rank
        assert names(await router.choose_replicas([a, b], gen(turn1))) == [["b"], ["a"]]
        router.on_request_routed(gen(turn1), a.replica_id, None)  # Serve placed it on a after all
        turn2 = turn1 + " assistant: an answer. user: second question"
        assert names(await router.choose_replicas([a, b], gen(turn2))) == [["a"], ["b"]]
        # a is full as far as the handle knows: b first
        router.replica_queue_len_cache.update(a.replica_id, 4)
        assert names(await router.choose_replicas([a, b], gen(turn2))) == [["b"], ["a"]]

    asyncio.run(run())


def test_unknown_loads_are_probed():
    async def run():
        a, b = StandIn("a", ongoing=3), StandIn("b", ongoing=1)
        router = await new_router(a, b)
        router.replica_queue_len_cache.invalidate_key(a.replica_id)
        router.replica_queue_len_cache.invalidate_key(b.replica_id)
        before = a.probes
        assert names(await router.choose_replicas([a, b], gen("x" * 500))) == [["b"], ["a"]]
        assert a.probes == before + 1

    asyncio.run(run())


def test_other_calls_and_a_single_replica_go_by_load():
    async def run():
        a, b = StandIn("a"), StandIn("b")
        router = await new_router(a, b)
        other = pending("tokenize me")
        assert names(await router.choose_replicas([a, b], other)) == [["a", "b"]]
        assert other.routing_context.should_backoff  # all tried: Serve backs off before the next round
        turn = gen(SYSTEM)
        await router.choose_replicas([a, b], turn)
        assert turn.routing_context.should_backoff
        assert names(await router.choose_replicas([a], gen(SYSTEM))) == [["a"]]
        assert await router.choose_replicas([], gen(SYSTEM)) == []

    asyncio.run(run())


def test_unknown_router_kwargs_are_ignored_not_fatal():
    async def run():
        router = await new_router(StandIn("a"), min_match_chars=512, threshold=3)
        assert router.prefix.min_match_chars == 512
        # a value the router cannot take: its defaults, not a router that fails every request of the handle
        router = await new_router(StandIn("a"), min_match_chars=512, node_chars=-1)
        assert router.prefix.min_match_chars == 256 and router.prefix.node_blocks == 0

    asyncio.run(run())


def test_a_scope_goes_by_its_own_records_only():
    async def run():
        a, b = StandIn("a", ongoing=1), StandIn("b", ongoing=0)
        router = await new_router(a, b, min_match_chars=128)
        router.on_request_routed(gen(SYSTEM, "key-1"), a.replica_id, None)
        assert names(await router.choose_replicas([a, b], gen(SYSTEM + " more", "key-1"))) == [["a"], ["b"]]
        # another scope knows nothing of key-1's prefix: the less loaded replica
        assert names(await router.choose_replicas([a, b], gen(SYSTEM + " more", "key-2"))) == [["b"], ["a"]]

    asyncio.run(run())


def test_records_follow_the_replicas_serve_reports():
    async def run():
        a, b, c = StandIn("a"), StandIn("b"), StandIn("c")
        router = await new_router(a, b, min_match_chars=128)
        router.on_request_routed(gen(SYSTEM), a.replica_id, None)
        assert router.prefix.matched_chars(SYSTEM, a.replica_id) > 0
        router.update_replicas([b, c])  # a went away, c came
        assert set(router.prefix.records) == {b.replica_id, c.replica_id}
        router.on_request_routed(gen(SYSTEM), b.replica_id, None)
        router.on_replica_actor_died(b.replica_id)
        assert set(router.prefix.records) == {c.replica_id}

    asyncio.run(run())


def test_a_dead_replicas_conversation_goes_to_its_node_where_the_disk_holds_it():
    async def run():
        a, b = StandIn("a", node="n1"), StandIn("b", ongoing=1, node="n1")
        c = StandIn("c", node="n2")
        router = await new_router(a, b, c, min_match_chars=128, node_chars=1 << 20)
        turn = SYSTEM + "user: first question"
        router.on_request_routed(gen(turn), a.replica_id, None)
        router.update_replicas([b, c])  # a died; n1's disk keeps what it saved
        ranks = await router.choose_replicas([b, c], gen(turn + " assistant: an answer. user: next"))
        assert names(ranks) == [["b"], ["c"]]  # b restores it from n1's disk; c, less loaded, would prefill it
        # replicas whose node Serve does not know: no node records, load decides
        plain = await new_router(StandIn("a"), StandIn("b", ongoing=1), min_match_chars=128, node_chars=1 << 20)
        assert plain.prefix.node_of == {}

    asyncio.run(run())


def test_an_adapter_set_goes_by_its_own_records_only():
    """KV computed under one adapter set is never reused under another (app/engine/lora.py), so a prefix sent
    under adapter a1 says nothing of where it is cached for a2 or the base; a zero scale is the base."""
    def under(prompt: str, adapters) -> PendingRequest:
        return pending(GenerationRequest(request_id="r", prompt=prompt, adapters=tuple(adapters)))

    async def run():
        a, b = StandIn("a", ongoing=1), StandIn("b", ongoing=0)
        router = await new_router(a, b, min_match_chars=128)
        router.on_request_routed(under(SYSTEM, [("a1", 1.0)]), a.replica_id, None)
        assert names(await router.choose_replicas([a, b], under(SYSTEM + " more", [("a1", 1.0)]))) == [["a"], ["b"]]
        for other in ([("a2", 1.0)], [("a1", 0.5)], [], [("a1", 1.0), ("a2", 1.0)]):
            assert names(await router.choose_replicas([a, b], under(SYSTEM + " more", other))) == [["b"], ["a"]], other
        router.on_request_routed(under(SYSTEM, []), a.replica_id, None)
        assert names(await router.choose_replicas([a, b], under(SYSTEM + " more", [("a2", 0.0)]))) == [["a"], ["b"]]

    asyncio.run(run())


def for_model(model: str, prompt: str) -> PendingRequest:
    return PendingRequest(args=[GenerationRequest(request_id="r", prompt=prompt)], kwargs={},
                          metadata=RequestMetadata(request_id="p", internal_request_id="p", multiplexed_model_id=model))


def test_a_pool_goes_to_the_replicas_holding_the_model_then_to_the_one_holding_the_prefix():
    async def run():
        a = StandIn("a", ongoing=0, models=("m1", "m3"))
        b = StandIn("b", ongoing=1, models=("m1", "m3"))
        c = StandIn("c", ongoing=0, models=("m2",))
        router = await new_router(a, b, c, router_class=PoolAffinityRouter, min_match_chars=128)
        turn1 = SYSTEM + "user: first question"
        # Only the replicas holding m1, the less loaded first: never c, which would have to load it.
        assert names(await router.choose_replicas([a, b, c], for_model("m1", turn1))) == [["a"], ["b"]]
        router.on_request_routed(for_model("m1", turn1), b.replica_id, None)  # placed on b after all
        turn2 = turn1 + " assistant: an answer. user: second question"
        assert names(await router.choose_replicas([a, b, c], for_model("m1", turn2))) == [["b"], ["a"]]
        # The same prompt under another model the same replicas hold: its KV is not there, so by load.
        assert names(await router.choose_replicas([a, b, c], for_model("m3", turn2))) == [["a"], ["b"]]
        assert names(await router.choose_replicas([a, b, c], for_model("m2", turn2))) == [["c"]]

    asyncio.run(run())


def test_a_model_no_pool_replica_holds_goes_to_a_replica_with_room_for_it():
    async def run():
        # a holds two busy models (no room); b, busier by requests, has an idle model it may evict.
        a = StandIn("a", ongoing=1, models=("m1", "m2"), room=0)
        b = StandIn("b", ongoing=3, models=("m3", "m4"), room=1)
        router = await new_router(a, b, router_class=PoolAffinityRouter)
        assert names(await router.choose_replicas([a, b], for_model("m5", "hello"))) == [["b"]]
        # A model a replica holds goes there whatever the room.
        assert names(await router.choose_replicas([a, b], for_model("m1", "hello"))) == [["a"]]
        # No replica with room (or none reported yet): by load, as before. (Another model each time: Serve waits
        # for the first cold request's replica to report the model before it routes that model's next requests.)
        b.routing_stats = {POOL_ROOM: 0}
        assert names(await router.choose_replicas([a, b], for_model("m7", "hello"))) == [["a"], ["b"]]
        a.routing_stats = b.routing_stats = {}
        assert names(await router.choose_replicas([a, b], for_model("m6", "hello"))) == [["a"], ["b"]]
        # No room anywhere: to the replica whose room comes after the fewest requests (b, busier overall, has a
        # model with one request on it where a's least busy has two); one whose models are all pinned, loading or
        # claimed (None) has no room coming.
        a.routing_stats, b.routing_stats = {POOL_ROOM: 0, POOL_AHEAD: 2}, {POOL_ROOM: 0, POOL_AHEAD: 1}
        assert names(await router.choose_replicas([a, b], for_model("m8", "hello"))) == [["b"]]
        b.routing_stats = {POOL_ROOM: 0, POOL_AHEAD: None}
        assert names(await router.choose_replicas([a, b], for_model("m9", "hello"))) == [["a"]]
        # Room in both: a free place (nothing evicted) before an idle model that would go, whatever the load.
        a.routing_stats, b.routing_stats = {POOL_ROOM: 2, POOL_FREE: 0}, {POOL_ROOM: 1, POOL_FREE: 1}
        a.ongoing = 0
        assert names(await router.choose_replicas([a, b], for_model("m10", "hello"))) == [["b"]]

    asyncio.run(run())


def test_a_pool_job_naming_its_replica_goes_there_and_one_naming_a_gone_replica_goes_by_the_model():
    from app.pools.admin import UnloadJob

    def job_for(replica: str) -> PendingRequest:
        return PendingRequest(args=[UnloadJob(replica=replica)], kwargs={}, metadata=RequestMetadata(
            request_id="j", internal_request_id="j", multiplexed_model_id="m1"))

    async def run():
        a, b, c = StandIn("a", models=("m1",)), StandIn("b", models=("m1",)), StandIn("c", models=("m2",))
        router = await new_router(a, b, c, router_class=PoolAffinityRouter)
        # Each replica that may hold the model is reached by name, the one not holding it too (an unpin of all).
        assert names(await router.choose_replicas([a, b, c], job_for("b"))) == [["b"]]
        assert names(await router.choose_replicas([a, b, c], job_for("c"))) == [["c"]]
        # Gone meanwhile: routed as the model's calls are (a replica that answers `replica_gone`).
        assert sorted(n for rank in names(await router.choose_replicas([a, b, c], job_for("z"))) for n in rank) == \
            ["a", "b"]

    asyncio.run(run())
