"""ChatProcessor: the processing (prompt rendering, grammars, reply parsing and shaping) as a deployment
of its own between the Ingress and the models (topology `graph`), and its client for the Ingress."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.config.app_args import AuthConfig, BatchConfig, Limits, TracingConfig
from app.config.spec import ModelSpec, deployment_name
from app.ops.placement import CHAT_PROCESSOR_DEFAULTS
from app.ops.pools import pool_deployment_name
from app.generation.caller import Caller
from app.serving.processing import Processor
from app.transport.stream_channels import ChannelRoute
from app.serving.traced_models import traced_models

from .batch_runner import batch_service
from .channels import channel_info, served, stream_call
from .error_mapping import answered, call_mapped
from .handles import StreamHop, unary
from .metrics import RayRequestObserver
from .models import RemoteModels
from .pool_status import running_replicas
from .replica import replica_info, start_replica
from .response_store import ActorResponseStore, store_enabled
from .tenant_ledger import tenancy


@serve.deployment(name="ChatProcessor", **copy.deepcopy(CHAT_PROCESSOR_DEFAULTS))
class ChatProcessor:
    def __init__(self, specs: list[ModelSpec], models: dict[str, DeploymentHandle], limits: Limits,
                 auth: AuthConfig, tracing_config: TracingConfig | None = None, *,
                 pools: dict[str, DeploymentHandle] | None = None, channels: bool = True,
                 batch: BatchConfig | None = None) -> None:
        start_replica(tracing_config)
        handles, names = dict(models), {mid: deployment_name(mid) for mid in models}
        for spec in specs:
            if spec.pool:  # Serve routes it to a pool replica that holds the model (model multiplexing)
                handles[spec.id] = (pools or {})[spec.pool].options(multiplexed_model_id=spec.id)
                names[spec.id] = pool_deployment_name(spec.pool)
        remote = traced_models(RemoteModels(handles, channels=channels), names)
        store = ActorResponseStore() if store_enabled(limits) else None
        app = serve.get_replica_context().app_name

        async def pool_replicas(pool: str) -> list[str]:  # the admin routes reach each of them by name
            return await asyncio.to_thread(running_replicas, app, pool_deployment_name(pool))

        self.processor = Processor(specs, remote, limits, observer=RayRequestObserver(),
                                   per_key_cache=auth.cache_isolation == "per_key", response_store=store,
                                   tenancy=tenancy(auth), pool_replicas=pool_replicas,
                                   batches=batch_service(batch or BatchConfig()))

    # The two verbs, whatever the request asks: Processor dispatches on its type, so a new route adds nothing here.
    async def respond(self, request: Any, caller: Caller) -> Any:
        return await answered(self.processor.respond(request, caller))

    async def stream(self, request: Any, caller: Caller,
                     route: ChannelRoute | None = None) -> AsyncIterator[list[dict[str, Any]]]:
        async for item in served(route, self.processor.stream(request, caller)):
            yield item

    def replica_info(self) -> dict[str, Any]:
        return {**replica_info(), "channels": channel_info()}


class RemoteProcessing:
    """app.serving.processing.Processing over a handle to the ChatProcessor deployment. `admit(model)` runs
    first for a request that names a model and may refuse it at once (a model no node can hold)."""

    def __init__(self, handle: DeploymentHandle, admit: Callable[[str], None], channels: bool = True) -> None:
        self.handle = unary(handle)
        self.streaming = StreamHop(handle)
        self.admit = admit
        self.channels = channels

    async def respond(self, request: Any, caller: Caller) -> dict[str, Any]:
        self._admit(request)
        return await call_mapped(lambda: self.handle.respond.remote(request, caller))

    def stream(self, request: Any, caller: Caller) -> AsyncIterator[list[dict[str, Any]]]:
        self._admit(request)
        return stream_call(self.channels,
                           lambda *route: self.streaming.to(request, caller).stream.remote(request, caller, *route))

    def _admit(self, request: Any) -> None:
        model = getattr(request, "model", None)  # a stored response's request names none: the store answers it
        if model is not None:
            self.admit(model)
