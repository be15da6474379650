"""The LlamaModel deployments' request router: Ray Serve's public RequestRouter API around the prefix
choice of app/routing/prefix_routing.py.

Serve builds one router per deployment handle, inside the caller's process (here the ChatProcessor
replica that streams from the model, and the Ingress for its health and stats calls), so the prefix
records are per caller. With one ChatProcessor replica they see every prompt. With several, each
learns only from the prompts it sent: a conversation whose turns reach different ChatProcessors may
land on different model replicas (still correct, fewer cache hits); a shared system prompt is
learned by each of them after its first request.

Configured per deployment by `request_router_config` (the builder sets it from the model's `routing`
key; a `deployments:` block in the serve config may replace it). Serve imports the class by its path
and ships it to the callers by value, so this module stays small and imports app/ by reference.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from ray.serve.request_router import (
    FIFOMixin, MultiplexMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica,
)
from ray.util import metrics

from app.engine.params import GenerationRequest
from app.pools.admin import PoolJob
from app.pools.manager import POOL_AHEAD, POOL_FREE, POOL_ROOM
from app.routing.prefix_routing import ROUTER_KWARGS, PrefixRouter, ReplicaLoad, router_kwargs_problem

logger = logging.getLogger("ray.serve")


T = TypeVar("T")


def argument_of(pending_request: PendingRequest | None, kind: type[T]) -> T | None:
    """The call's first argument of type `kind` (None: no call, or none of that type)."""
    if pending_request is None:
        return None
    return next((a for a in (*pending_request.args, *pending_request.kwargs.values()) if isinstance(a, kind)), None)


def prompt_of(pending_request: PendingRequest | None) -> tuple[str, str] | None:
    """The rendered prompt of a `generate(GenerationRequest)` call and its scope (its cache scope and LoRA
    adapters: prefixes are matched within a scope only); None for every other method (`run` with its job,
    replica_info), which go by load."""
    gen = argument_of(pending_request, GenerationRequest)
    return None if gen is None else (gen.routed_text, gen.prefix_scope)


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Sends a prompt to the replica most likely holding the KV of its longest prefix, unless that
    replica is busy; then to a replica whose node's disk holds it (node records: the KV tiers); everything
    else (and a busy preferred replica) to the least loaded replica.

    `choose_replicas` returns ranks: [[preferred], [the rest, best first]]; Serve tries the first rank
    (the replica may still reject a request when full) and then the next, picking the least loaded in
    a rank. Records are updated only once a replica has accepted a request (`on_request_routed`).

    FIFOMixin: a replica found is handed to the oldest waiting request, as Serve's own router does.
    Without it Serve matches the replica to the request by its internal request id, which every call
    made while serving one HTTP request shares (Ray 2.60): of two concurrent generations for one request
    (a legacy prompt list) only the first was ever dispatched, and the other waited forever
    (ray-project/ray#66325 describes the same failure of id-matching routers). With no queue the oldest
    waiting request is the one routed, so the prefix choice holds; under a queue, order wins over affinity.
    """

    def initialize_state(self, **kwargs: Any) -> None:
        # request_router_kwargs: block_chars, max_chars, min_match_chars, imbalance, node_chars
        # (app/routing/prefix_routing.py).
        # `llamaray check-config` refuses other keys; here they are only logged, since failing would fail
        # every request of this handle.
        unknown = sorted(set(kwargs) - ROUTER_KWARGS)
        if unknown:
            logger.error("llamaray: request_router_kwargs %s are not settings of the prefix router (known: %s); "
                         "ignored", unknown, ", ".join(sorted(ROUTER_KWARGS)))
        known = {k: v for k, v in kwargs.items() if k in ROUTER_KWARGS}
        problem = router_kwargs_problem(known)
        if problem:
            logger.error("llamaray: request_router_kwargs %s: %s; the prefix router's defaults are used", known, problem)
            known = {}
        self.prefix = PrefixRouter(**known)
        self.decisions = metrics.Counter(
            "llamaray_route_decisions_total",
            "Model requests routed, by why the replica was chosen (prefix, node, load, busy).",
            tag_keys=("deployment", "reason"))
        self._deployment = self._deployment_id.name

    def _prefix(self) -> PrefixRouter:
        # Serve calls initialize_state right after construction; this covers a router built without it.
        if not hasattr(self, "prefix"):
            self.initialize_state()
        return self.prefix

    async def _loads(self, candidates: list[RunningReplica]) -> dict[ReplicaID, ReplicaLoad]:
        """Each candidate's ongoing requests: from the handle's queue-length cache (kept fresh by every
        request it sends and every answer it gets), asking the replicas missing from it."""
        cache = self.replica_queue_len_cache
        ongoing: dict[ReplicaID, int | None] = {r.replica_id: cache.get(r.replica_id) for r in candidates}
        missing = [r for r in candidates if ongoing[r.replica_id] is None]
        if missing:
            # The same probe Serve's own routers use (a protected method of the pinned Ray 2.60).
            for replica, queue_len in await self._probe_queue_lens(missing, 0):
                ongoing[replica.replica_id] = queue_len
        return {r.replica_id: ReplicaLoad(ongoing[r.replica_id], r.max_ongoing_requests) for r in candidates}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Every candidate is in the ranks below: once they are tried, Serve should back off before
            # asking again (its locality mixin sets this too; without it a full deployment is re-probed
            # in a tight loop).
            pending_request.routing_context.should_backoff = True
        if not candidate_replicas:
            return []
        routed = self._routed(pending_request)
        if routed is None or len(candidate_replicas) == 1:
            # Not a generation, or nothing to choose: Serve takes the least loaded of the rank.
            return [candidate_replicas]
        loads = await self._loads(candidate_replicas)
        prompt, scope = routed
        choice = self._prefix().choose(prompt, loads, scope)
        self.decisions.inc(1, {"deployment": self._deployment, "reason": choice.reason})
        by_id = {r.replica_id: r for r in candidate_replicas}
        first, rest = by_id[choice.replica], [by_id[rid] for rid in choice.order[1:]]
        return [[first], rest] if rest else [[first]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        # Serve calls this once the replica accepted the request (its rejection protocol, on for every
        # handle but a Ray Client's); without it nothing is recorded and the router goes by load.
        routed = self._routed(pending_request)
        if routed is not None:
            prompt, scope = routed
            self._prefix().record(prompt, replica_id, scope)

    def _routed(self, pending_request: PendingRequest | None) -> tuple[str, str] | None:
        return prompt_of(pending_request)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        # node_id is None where Serve does not know it yet: no node record for that replica then.
        self._prefix().sync((r.replica_id for r in replicas), {r.replica_id: r.node_id for r in replicas})

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._prefix().forget(replica_id)


def named_replica(pending_request: PendingRequest | None) -> str | None:
    """The replica an admin job names (app/pools/admin.py `PoolJob.replica`; None: any other call, or a job for
    wherever its model is routed)."""
    job = argument_of(pending_request, PoolJob)
    return None if job is None else job.replica


def with_room(replicas: list[RunningReplica]) -> list[RunningReplica]:
    """The pool replicas that reported a free place (POOL_FREE > 0: the load evicts nothing), else room for a
    model now (POOL_ROOM > 0: an idle model to evict, which its next request would load again); where none did,
    those whose room comes after the fewest requests (POOL_AHEAD); all of them where none reported either."""
    stats = [(r, r.routing_stats or {}) for r in replicas]
    free = [r for r, s in stats if s.get(POOL_FREE, 0) > 0]
    if free:
        return free
    roomy = [r for r, s in stats if s.get(POOL_ROOM, 0) > 0]
    if roomy:
        return roomy
    ahead = [(s[POOL_AHEAD], r) for r, s in stats if s.get(POOL_AHEAD) is not None]
    if not ahead:
        return replicas
    fewest = min(n for n, _ in ahead)
    return [r for n, r in ahead if n == fewest]


class PoolAffinityRouter(MultiplexMixin, PrefixAffinityRouter):
    """A model pool's router (deployments/pool.py): Serve's multiplexed choice first (the replicas that hold the
    request's model; past Serve's matching timeout, those holding the fewest models, then any: a cold load),
    then the prefix choice among them. Of two replicas holding a popular model, a conversation's next turn
    goes back to the one holding its KV. A model no replica holds goes to a replica with room for it now (a free
    place first, else an idle model to evict: its `record_routing_stats`, at most a second old) where one has: elsewhere
    it would wait for a held model's requests to end (seconds each on a CPU) before its load could begin; where
    none has, to the replica whose room comes after the fewest requests. An
    admin job naming its replica (unload, pin) goes to that replica, so it reaches each replica that may hold
    the model; a `deployments:` block that names another router loses that (an unload then reaches one replica
    only)."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        name = named_replica(pending_request)
        if name is not None:
            named = [r for r in candidate_replicas if r.replica_id.unique_id == name]
            if named:
                return [named]
            # Gone: any replica takes it and answers `replica_gone` (LlamaPool.run), which the admin skips.
        model_id = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        if model_id:
            holding = self.apply_multiplex_routing(pending_request=pending_request)
            candidate_replicas = [r for r in candidate_replicas if r.replica_id in holding]
            if not self._multiplexed_model_id_to_replica_ids.get(model_id):  # held nowhere: a cold load
                candidate_replicas = with_room(candidate_replicas)
        return await super().choose_replicas(candidate_replicas, pending_request)

    def _routed(self, pending_request: PendingRequest | None) -> tuple[str, str] | None:
        # Prefixes are matched per model: one prompt's KV under one model is nothing to another.
        routed = prompt_of(pending_request)
        if routed is None or pending_request is None:
            return routed
        prompt, scope = routed
        return prompt, f"{pending_request.metadata.multiplexed_model_id}\0{scope}"
