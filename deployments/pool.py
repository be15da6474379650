"""LlamaPool: one deployment whose replicas each hold up to `max_models` of a pool's models (a PoolManager,
app/pools/manager.py), each in an EngineHost of its own, loaded on a model's first request.

A caller names the model with Serve's model multiplexing (`handle.options(multiplexed_model_id=<id>)`), so
Serve routes the request to a replica that holds the model, or has it loading, when there is one. Which
models a replica holds is the PoolManager's business (pinned, busy and budget aware), not Serve's own LRU:
`_routed`, the `@serve.multiplexed` method, only records the model in Serve's routing table (no limit of its
own), and the pool removes a model from that table when it unloads it (`PoolRouting.dropped`).

Also the pool of the single-shape Ingress (`LocalPool`): the same PoolManager and hosts, no multiplexing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from ray import serve

from app.api.errors import APIError, model_not_found, service_unavailable
from app.config.app_args import TracingConfig
from app.config.spec import ModelSpec
from app.engine import GenerationRequest
from app.engine.params import Job
from app.pools.admin import REPLICA_GONE, PoolJob
from app.pools.hosted import PooledHost
from app.pools.manager import POOL_AHEAD, POOL_FREE, POOL_ROOM, PoolManager
from app.pools.plan import PoolPlan
from app.transport.stream_channels import ChannelRoute

from . import pool_status
from .channels import served
from .engine_host import EngineHost
from .error_mapping import answered
from .metrics import PoolMetrics
from .replica import replica_info, start_replica

logger = logging.getLogger("ray.serve")
# Serve's attribute for a replica's multiplexing state (ray/serve/api.py, `multiplexed`).
_SERVE_MULTIPLEX_ATTR = "__serve_multiplex_wrapper"


class LocalPool:
    """A pool's models in this process: a PoolManager over EngineHosts, its pinned models loaded now, each
    load and unload counted in metrics. `on_change()` hears of every change of what it holds."""

    def __init__(self, plan: PoolPlan, specs: list[ModelSpec], on_change=lambda event, model_id: None) -> None:
        self.plan = plan
        self.specs = {s.id: s for s in specs}
        self.metrics = PoolMetrics(plan.name)
        self._on_change = on_change
        self.manager: PoolManager[EngineHost] = PoolManager(plan, self._load, self._unload, on_event=self._event)
        self.hosts = {mid: PooledHost(self.manager, mid) for mid in self.specs}
        for model_id in plan.pinned:  # a failed pinned load is tried again by its first request
            try:
                self.manager.adopt(model_id, _ready_host(self.specs[model_id]))
            except RuntimeError as exc:
                logger.error("pool %r: pinned model %r did not load: %s", plan.name, model_id, exc)

    async def _load(self, model_id: str) -> EngineHost:
        self._on_change("loading", model_id)  # published: /v1/models shows it loading, not only once loaded
        loop, changed = asyncio.get_running_loop(), asyncio.Event()

        def wake() -> None:  # on the fetch thread, which must go on to start the engine whatever happens here
            with contextlib.suppress(RuntimeError):  # the loop closed: the replica is going away
                loop.call_soon_threadsafe(changed.set)
        # A remote model (hf://, s3://, a checksum) starts on a thread of its own once fetched, even when the file
        # is already in the node's cache: its waiting request is woken by that, not by a poll's next tick.
        host = await asyncio.to_thread(EngineHost, self.specs[model_id], wake)
        while True:
            changed.clear()
            if host.state().state not in ("loading", "downloading"):
                break
            with contextlib.suppress(asyncio.TimeoutError):  # a missed wake costs a second, never a hang
                await asyncio.wait_for(changed.wait(), 1.0)
        state = host.state()
        if not state.ready:
            await asyncio.to_thread(host.close)
            raise RuntimeError(state.reason or state.state)
        return host

    async def _unload(self, host: EngineHost) -> None:
        await asyncio.to_thread(host.close)

    def _event(self, event: str, model_id: str, detail: Any) -> None:
        self.metrics.record(event, model_id, detail, len(self.manager.entries))
        if event not in ("room_waited", "claimed"):  # nothing the routers or /v1/models see until it is evicted
            self._on_change(event, model_id)

    def states(self) -> dict[str, str]:
        return self.manager.states()

    def close(self) -> None:
        """Free every engine (the replica is going away)."""
        for host in self.manager.loaded().values():
            host.close()


def _ready_host(spec: ModelSpec) -> EngineHost:
    host = EngineHost(spec)
    if host.engine is None:  # a pinned remote model: not waited for here; its first request loads it
        host.close()
        raise RuntimeError(host.state().reason or "its engine did not start")
    return host


@serve.deployment(name="LlamaPool", ray_actor_options={"num_cpus": 1}, health_check_period_s=10)
class LlamaPool:
    def __init__(self, plan: PoolPlan, specs: list[ModelSpec], tracing_config: TracingConfig | None = None) -> None:
        start_replica(tracing_config)
        context = serve.get_replica_context()
        self._where = (context.app_name, context.deployment, context.replica_id.unique_id)
        self._publish_lock = threading.Lock()
        self.pool = LocalPool(plan, specs, on_change=self._changed)
        self._publish()

    async def record_routing_stats(self) -> dict[str, Any]:
        """What the pool router reads of this replica (Serve asks every request_routing_stats_period_s): how many
        models could begin loading here now, without a wait for a held model to go idle, how many of them in a free
        place, and else how many requests that wait would be for."""
        manager = self.pool.manager
        return {POOL_ROOM: manager.room_now(), POOL_FREE: manager.free_now(), POOL_AHEAD: manager.ahead_now()}

    @serve.multiplexed(max_num_models_per_replica=-1)
    async def _routed(self, model_id: str) -> str:
        """Registers `model_id` in Serve's routing table for this replica (the pool does the loading)."""
        return model_id

    async def _host(self, routed: bool = True) -> PooledHost:
        """The named model's host; `routed`: the request may load it, so Serve routes the model here from now on
        (an admin job that never loads, such as an unload or a pin, must not)."""
        model_id = serve.get_multiplexed_model_id()
        if routed:
            await self._routed(model_id)
        host = self.pool.hosts.get(model_id)
        if host is None:
            raise model_not_found(model_id)
        return host

    def _changed(self, event: str, model_id: str) -> None:
        if event in ("evicted", "load_failed"):
            self._unroute(model_id)
        self._publish()

    def _unroute(self, model_id: str) -> None:
        """Serve routes the model here no more; the next request for it goes to any replica."""
        wrapper = getattr(self, _SERVE_MULTIPLEX_ATTR, None)
        if wrapper is not None and model_id in wrapper.models:
            wrapper.models.pop(model_id, None)
            wrapper._push_multiplexed_replica_info = True

    def _unroute_unless_held(self, model_id: str) -> None:
        """After a request that failed: a model this replica does not hold (a load refused, or one that failed
        a while ago and is remembered) is not left in Serve's routing table, where `_routed` put it."""
        if self.pool.manager.state(model_id) == "available":
            self._unroute(model_id)

    def _publish(self) -> None:
        if not hasattr(self, "pool"):
            return  # the pinned models load in the constructor; it publishes once the pool exists
        with self._publish_lock:
            pool_status.publish(*self._where, self.pool.states())

    async def generate(self, request: GenerationRequest, route: ChannelRoute | None = None):
        async for item in served(route, self._generate(request)):
            yield item

    async def _generate(self, request: GenerationRequest):
        host = await self._host()
        try:
            async for batch in host.generate(request):
                yield batch
        except APIError:
            self._unroute_unless_held(host.model_id)
            raise

    async def run(self, job: Job[Any]) -> Any:
        """Any other job (app/engine/jobs.py) for the model the request names, loading it first when cold (a
        refusal answered as a value: error_mapping.answered)."""
        return await answered(self._run(job))

    async def _run(self, job: Job[Any]) -> Any:
        if isinstance(job, PoolJob):  # an admin job names its replica (deployments/prefix_router.py PoolAffinityRouter sends it there)
            if job.replica is not None and job.replica != self._where[2]:
                raise service_unavailable(f"pool replica {job.replica} is gone", code=REPLICA_GONE)
            return await (await self._host(routed=job.loads)).run(job)
        host = await self._host()
        try:
            return await host.run(job)
        except APIError:
            self._unroute_unless_held(host.model_id)
            raise

    def pool_states(self) -> dict[str, str]:
        """This replica's models: loaded, loading or available (tests and operators)."""
        return self.pool.states()

    def replica_info(self) -> dict[str, Any]:
        return {**replica_info(), "pool": self.pool.plan.name, "models": self.pool.states()}

    def check_health(self) -> None:
        self._publish()
        for host in self.pool.manager.loaded().values():
            host.check_health()

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()
        if getattr(self, "_where", None):
            pool_status.withdraw(*self._where)
