"""Ingress: the Starlette app from app/server.py, backed by handles to the ChatProcessor or the models, or
(`llama_model: ingress`) by the models' engines running in this replica."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from app.auth import KeyChecker, load_api_keys, require_keys
from app.config import AuthConfig, Limits, ModelSpec, deployment_name
from app.errors import service_unavailable
from app.placement import INGRESS_DEFAULTS, fits, unplaceable_message
from app.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from app.server import ServerSettings, build_http_app, model_cards

from .chat_processor import HandleModels, LocalModels, Processing
from .errors import to_api_error
from .model_host import ModelHost
from .placement import autoscaler_can_add_nodes, deployment_placement, node_resources
from .relay import relay
from .replica import replica_info

logger = logging.getLogger("ray.serve")


@serve.deployment(name="Ingress", **copy.deepcopy(INGRESS_DEFAULTS))
@serve.ingress()
class Ingress:
    def __init__(self, processor: DeploymentHandle | None, specs: list[ModelSpec],
                 models: dict[str, DeploymentHandle] | None, limits: Limits, auth: AuthConfig) -> None:
        # processor None: the ChatProcessor's work runs here, one Ray hop less per streamed item.
        # models None: so do the models' engines (no Ray hop between HTTP and llama.cpp).
        self.processor = processor
        self.stream_processor = processor.options(stream=True) if processor is not None else None
        self.hosts = {spec.id: ModelHost(spec) for spec in specs} if models is None else None
        reach = LocalModels(self.hosts) if self.hosts is not None else HandleModels(models or {})
        self.local = Processing(specs, reach, limits) if processor is None else None
        self.specs = specs
        self.models = models or {}
        # Keys are read here, in the replica's own environment (env var or secret file).
        keys = load_api_keys(auth.api_keys_env, auth.api_keys_file)
        require_keys(keys, auth.required, auth.api_keys_env, auth.api_keys_file)
        if not keys:
            logger.warning("no API keys loaded: this endpoint serves without authentication "
                           "(set $%s or auth.api_keys_file; auth.required: true refuses to start without)",
                           auth.api_keys_env)
        self.settings = ServerSettings(max_body_bytes=limits.max_body_bytes, max_messages=limits.max_messages,
                                       keys=KeyChecker(keys), stream_keepalive_s=limits.stream_keepalive_s)
        # Model deployments whose replicas no node can hold (and no autoscaler can add one): model id -> why.
        self.unplaced: dict[str, str] = {}
        self._app_name = serve.get_replica_context().app_name
        if self.hosts is None:  # model deployments to watch
            threading.Thread(target=self._watch_placement, name="llamaray-placement", daemon=True).start()

    def __serve_build_asgi_app__(self):
        return build_http_app(self, model_cards(self.specs), self.settings)

    def _check_placed(self, model_id: str) -> None:
        if model_id in self.unplaced:  # fail at once instead of queueing until the deadline
            raise service_unavailable(self.unplaced[model_id], code="model_unplaceable")

    async def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        self._check_placed(request.model)
        return await self._call("complete", request)

    def stream(self, request: ChatCompletionRequest):
        self._check_placed(request.model)
        return self._stream("stream", request)

    async def text_complete(self, request: CompletionRequest) -> dict[str, Any]:
        self._check_placed(request.model)
        return await self._call("text_complete", request)

    def text_stream(self, request: CompletionRequest):
        self._check_placed(request.model)
        return self._stream("text_stream", request)

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        self._check_placed(request.model)
        return await self._call("tokenize", request)

    async def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        self._check_placed(request.model)
        return await self._call("detokenize", request)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            if self.local is not None:
                return await getattr(self.local, method)(request)
            return await getattr(self.processor, method).remote(request)
        except Exception as exc:  # noqa: BLE001 - Ray's failures (back-pressure, dead replicas) as OpenAI errors
            raise to_api_error(exc) from None

    def _stream(self, method: str, request: Any):
        if self.local is not None:  # its model calls go through relay(): Ray's failures arrive mapped
            return getattr(self.local, method)(request)
        return relay(lambda: getattr(self.stream_processor, method).remote(request))

    async def model_stats(self, model_id: str) -> dict[str, Any]:
        """A model's engine stats (running, waiting, slots, steps...), wherever its engine runs."""
        if self.hosts is not None:
            return self.hosts[model_id].stats()
        return await self.models[model_id].stats.remote()

    def replica_info(self) -> dict[str, Any]:
        info = replica_info()
        if self.hosts is not None:
            info["models"] = {mid: host.info() for mid, host in self.hosts.items()}
        return info

    def check_health(self) -> None:
        for host in (self.hosts or {}).values():
            host.check_health()

    def __del__(self) -> None:
        for host in (getattr(self, "hosts", None) or {}).values():
            host.close()

    def _watch_placement(self) -> None:
        """Every few seconds while a model has no running replica: can any node hold one? If not, and no
        autoscaler can add such a node, say why once in the log and in /health (instead of waiting silently)."""
        said: set[str] = set()
        while True:
            try:
                waiting = self._check_placement(said)
            except Exception as exc:  # noqa: BLE001 - controller busy or gone: try again later
                logger.debug("placement check failed: %s", exc)
                waiting = True
            time.sleep(5 if waiting else 30)

    def _check_placement(self, said: set[str]) -> bool:
        names = {deployment_name(spec.id): spec.id for spec in self.specs}
        pending = {n: req for n, (req, running) in deployment_placement(self._app_name, list(names)).items()
                   if running == 0}
        unplaced: dict[str, str] = {}
        if pending:
            nodes, can_add = node_resources(), autoscaler_can_add_nodes()
            for name, request in pending.items():
                model_id = names[name]
                why = None if can_add else unplaceable_message(model_id, name, request, nodes)
                if why is not None:
                    unplaced[model_id] = why
                    if model_id not in said:
                        logger.error("llamaray: %s", why)
                elif can_add and not any(fits(request, n) for n in nodes) and model_id not in said:
                    logger.warning("llamaray: %s waits for a node that can hold a replica (%s): no node has it "
                                   "now; the autoscaler may be launching one (minutes)", name, request)
                else:
                    continue
                said.add(model_id)
        self.unplaced = unplaced
        return bool(pending)

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
        if self.hosts is not None:
            stats = {mid: host.stats() for mid, host in self.hosts.items()}
            return {mid: s.get("error") or bool(s.get("healthy")) for mid, s in stats.items()}
        # A model scaled to zero is ready (the first request waits for a replica); asking it for
        # stats would itself start a replica, so it is not asked.
        try:
            cold = await asyncio.to_thread(self._scaled_to_zero)
        except Exception:  # noqa: BLE001 - no controller answer: ask the replicas directly
            cold = set()

        unplaced = dict(self.unplaced)

        async def one(model_id: str) -> bool | str:
            if model_id in unplaced:
                return unplaced[model_id]
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
