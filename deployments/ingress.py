"""Ingress: the Starlette app from app/server.py, backed by handles to the ChatProcessor."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.auth import KeyChecker, load_api_keys, require_keys
from app.config import AuthConfig, Limits, ModelSpec, deployment_name
from app.schemas import ChatCompletionRequest
from app.server import ServerSettings, build_http_app, model_cards

from .errors import to_api_error
from .relay import relay
from .replica import replica_info

logger = logging.getLogger("ray.serve")


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=256)
@serve.ingress()
class Ingress:
    def __init__(self, processor: DeploymentHandle, specs: list[ModelSpec], models: dict[str, DeploymentHandle],
                 limits: Limits, auth: AuthConfig) -> None:
        self.processor = processor
        self.stream_processor = processor.options(stream=True)
        self.specs = specs
        self.models = models
        # Keys are read here, in the replica's own environment (env var or secret file).
        keys = load_api_keys(auth.api_keys_env, auth.api_keys_file)
        require_keys(keys, auth.required, auth.api_keys_env, auth.api_keys_file)
        if not keys:
            logger.warning("no API keys loaded: this endpoint serves without authentication "
                           "(set $%s or auth.api_keys_file; auth.required: true refuses to start without)",
                           auth.api_keys_env)
        self.settings = ServerSettings(max_body_bytes=limits.max_body_bytes, max_messages=limits.max_messages,
                                       keys=KeyChecker(keys), stream_keepalive_s=limits.stream_keepalive_s)

    def __serve_build_asgi_app__(self):
        return build_http_app(self, model_cards(self.specs), self.settings)

    async def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        try:
            return await self.processor.complete.remote(request)
        except Exception as exc:  # noqa: BLE001
            raise to_api_error(exc) from None

    def stream(self, request: ChatCompletionRequest):
        return relay(self.stream_processor.stream.remote(request))

    def replica_info(self) -> dict[str, Any]:
        return replica_info()

    def _scaled_to_zero(self) -> set[str]:
        """Model deployments that Serve reports healthy with no replica (min_replicas: 0)."""
        app = serve.status().applications.get(serve.get_replica_context().app_name)
        if app is None:
            return set()
        cold = set()
        for spec in self.specs:
            dep = app.deployments.get(deployment_name(spec.id))
            running = sum(dep.replica_states.values()) if dep else -1
            if dep is not None and running == 0 and str(getattr(dep.status, "value", dep.status)) == "HEALTHY":
                cold.add(spec.id)
        return cold

    async def ready(self) -> dict[str, bool | str]:
        # A model scaled to zero is ready (the first request waits for a replica); asking it for
        # stats would itself start a replica, so it is not asked.
        try:
            cold = await asyncio.to_thread(self._scaled_to_zero)
        except Exception:  # noqa: BLE001 - no controller answer: ask the replicas directly
            cold = set()

        async def one(model_id: str) -> bool | str:
            if model_id in cold:
                return True
            try:
                stats = await asyncio.wait_for(self.models[model_id].stats.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - not loaded yet, or failing: not ready
                return False
            return stats.get("error") or bool(stats.get("healthy"))

        ids = list(self.models)
        results = await asyncio.gather(*(one(m) for m in ids))
        return dict(zip(ids, results))
