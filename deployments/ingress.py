"""The Ingress: the Starlette app of app/http/app.py, one complete deployment class per topology, chosen
by the builder.

- `GraphIngress` (topology `graph`, the cluster's shape): HTTP, keys and SSE framing only; the processing
  runs in the ChatProcessor deployment (a Ray handle), the models in their LlamaModel deployments.
- `SingleIngress` (topology `single`, `make run` on a small machine): the processing and the models'
  engines run in this very replica, which serves HTTP itself: no Ray hop per request or streamed item.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.config.app_args import AuthConfig, BatchConfig, Limits, TracingConfig
from app.generation.caller import Caller
from app.http.batch_routes import BatchEdge
from app.config.spec import ModelSpec
from app.engine.jobs import StatsJob
from app.http.auth import KeyChecker, load_key_registry, require_keys
from app.http.browser_guard import HOSTS_ENV, ORIGINS_ENV, browser_policy, entries
from app.http.routes import TABLE
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.metrics_page import NodeMetrics
from app.http.model_cards import model_cards
from app.ops.placement import INGRESS_DEFAULTS
from app.serving.health import HealthCache, Refresh
from app.ops.pools import pool_deployment_name
from app.pools.plan import PoolPlan
from app.serving.models import READY, ModelState
from app.serving.processing import Processing, Processor
from app.serving.traced import traced_processing
from app.serving.traced_models import traced_models

from .batch_runner import batch_service, batch_store, max_line_bytes
from .channels import channel_info
from .chat_processor import RemoteProcessing
from .direct_ingress import bind_with_reuse_address
from .error_mapping import answered
from .engine_host import EngineHost
from .metrics import RayRequestObserver
from .models import LocalModels
from .node_metrics import NodeExport
from .placement_watch import PlacementWatch, cluster_model_states
from .pool import LocalPool
from .pool_status import cluster_pool_states
from .replica import replica_info, start_replica
from .response_store import ActorResponseStore, store_enabled
from .tenant_ledger import tenancy

logger = logging.getLogger("ray.serve")


class _Front:
    """What every Ingress does, whatever runs behind it: API keys read in the replica's own environment,
    the HTTP app over a processing, /health from a background-refreshed cache."""

    pool_states: dict[str, str] = {}  # pooled model -> loaded, loading or available, as last refreshed

    def _serve(self, specs: list[ModelSpec], limits: Limits, auth: AuthConfig, processing: Processing,
               refresh: Refresh, batch: BatchConfig | None = None) -> None:
        bind_with_reuse_address()  # before Serve binds this replica's port, once the constructor returns
        keys = load_key_registry(auth.api_keys_env, auth.api_keys_file)
        require_keys(keys, auth.required, auth.api_keys_env, auth.api_keys_file)
        if not keys.enabled:
            logger.warning("no API keys loaded: this endpoint serves without authentication "
                           "(set $%s or auth.api_keys_file; auth.required: true refuses to start without)",
                           auth.api_keys_env)
        self.specs = specs
        self.processing = processing
        self.health = HealthCache(refresh, [s.id for s in specs])
        # Hosts and origins from the config and, like the keys, from this replica's environment.
        browser = browser_policy(not keys.enabled, entries(auth.allowed_hosts, os.environ.get(HOSTS_ENV)),
                                 entries(auth.allowed_origins, os.environ.get(ORIGINS_ENV)))
        self.settings = ServerSettings(max_body_bytes=limits.max_body_bytes, max_messages=limits.max_messages,
                                       keys=KeyChecker(registry=keys), stream_keepalive_s=limits.stream_keepalive_s,
                                       browser=browser)
        self.node_metrics = NodeMetrics(NodeExport().read, serve.get_replica_context().app_name)
        batch = batch or BatchConfig()
        # Uploads, downloads and a Message Batch's body, streamed between the client and the batch store here.
        self.batch_edge = (BatchEdge(batch_store(batch), batch, max_line_bytes(batch, limits)) if batch.enabled
                           else None)

    async def _pool_states(self) -> dict[str, str]:
        await self.health.get()  # refreshed with the health states, at most once a second
        return self.pool_states

    def __serve_build_asgi_app__(self):
        return build_http_app(self.processing, model_cards(self.specs), self.settings, self.health,
                              pool_states=self._pool_states, node_metrics=self.node_metrics,
                              batches=self.batch_edge)


@serve.deployment(name="Ingress", **copy.deepcopy(INGRESS_DEFAULTS))
@serve.ingress()
class GraphIngress(_Front):
    def __init__(self, processor: DeploymentHandle, specs: list[ModelSpec], limits: Limits, auth: AuthConfig,
                 tracing_config: TracingConfig | None = None, *, channels: bool = True,
                 batch: BatchConfig | None = None) -> None:
        start_replica(tracing_config)
        self.app_name = serve.get_replica_context().app_name
        self.own = [s for s in specs if not s.pool]  # models with a deployment of their own
        self.pools: dict[str, list[str]] = {}
        for spec in specs:
            if spec.pool:
                self.pools.setdefault(pool_deployment_name(spec.pool), []).append(spec.id)
        self.placement = PlacementWatch(self.app_name, self.own)
        processing = traced_processing(RemoteProcessing(processor, self.placement.admit, channels), "ChatProcessor",
                                       TABLE.hop_traced)
        self._serve(specs, limits, auth, processing, self._states, batch)

    async def _states(self) -> dict[str, ModelState]:
        states = await asyncio.to_thread(cluster_model_states, self.app_name, self.own, dict(self.placement.unplaced))
        if self.pools:
            self.pool_states, health = await asyncio.to_thread(cluster_pool_states, self.app_name, self.pools)
            states.update(health)
        return states

    def replica_info(self) -> dict[str, Any]:
        return {**replica_info(), "placement_checks": self.placement.checks, "channels": channel_info()}


@serve.deployment(name="Ingress", **copy.deepcopy(INGRESS_DEFAULTS))
@serve.ingress()
class SingleIngress(_Front):
    def __init__(self, specs: list[ModelSpec], limits: Limits, auth: AuthConfig,
                 tracing_config: TracingConfig | None = None, pools: list[PoolPlan] = (),
                 batch: BatchConfig | None = None) -> None:
        start_replica(tracing_config)
        # Each pool's models are served by a PoolManager here (no multiplexing: one replica holds them all).
        self.pools = [LocalPool(plan, [s for s in specs if s.pool == plan.name]) for plan in pools]
        hosts: dict[str, Any] = {spec.id: EngineHost(spec) for spec in specs if not spec.pool}
        for pool in self.pools:
            hosts.update(pool.hosts)
        self.models = LocalModels(hosts)
        store = ActorResponseStore() if store_enabled(limits) else None
        processor = Processor(specs, traced_models(self.models), limits, observer=RayRequestObserver(),
                              per_key_cache=auth.cache_isolation == "per_key", response_store=store,
                              tenancy=tenancy(auth), batches=batch_service(batch or BatchConfig()))
        self._serve(specs, limits, auth, processor, self._states, batch)

    async def _states(self) -> dict[str, ModelState]:
        self.pool_states = {m: s for pool in self.pools for m, s in pool.states().items()}
        # A pooled model is ready: its first request waits for its load.
        return {mid: READY if mid in self.pool_states else host.state() for mid, host in self.models.hosts.items()}

    async def _pool_states(self) -> dict[str, str]:
        return {m: s for pool in self.pools for m, s in pool.states().items()}

    async def respond(self, request: Any, caller: Caller) -> Any:
        """The processing's whole answer over a handle: how the batch runner (deployments/batch_runner.py) sends a
        line here, where the processing runs in this replica (a refusal answered as a value, as the
        ChatProcessor's)."""
        return await answered(self.processing.respond(request, caller))

    async def model_stats(self, model_id: str) -> dict[str, Any]:
        """A model's engine stats (running, waiting, slots, steps...): tests and operators."""
        return await self.models.run(model_id, StatsJob())

    def replica_info(self) -> dict[str, Any]:
        return {**replica_info(), "models": {mid: host.info() for mid, host in self.models.hosts.items()}}

    def check_health(self) -> None:
        for host in self.models.hosts.values():
            host.check_health()

    def __del__(self) -> None:
        models = getattr(self, "models", None)
        if models is not None:
            models.close()
        for pool in getattr(self, "pools", ()):
            pool.close()
