"""The application builder named in serve_config.yaml: validated args -> the deployment graph of the
configured topology, each shape a complete set of deployment classes."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.prompt.preflight import preflight
from app.config.app_args import AppArgs, parse_args
from app.config.resolution import resolve_models
from app.config.spec import ModelSpec, deployment_name
from app.ops.adapter_check import check_adapters
from app.ops.placement import model_deployment_defaults
from app.ops.pools import pool_deployment_defaults, pool_deployment_name, pool_plans, single_hosting_defaults

from .batch_runner import runner_actors
from .chat_processor import ChatProcessor
from .ingress import GraphIngress, SingleIngress
from .llama_model import LlamaModel
from .pool import LlamaPool
from .response_store import response_store_actors
from .tenant_ledger import ledger_actors


def build_app(args: dict[str, Any]) -> Application:
    parsed = parse_args(args)
    specs = resolve_models(parsed)
    for spec in specs:
        preflight(spec)
        check_adapters(spec)
    # The resolved specs and validated configs go to the replicas as they are (they pickle).
    build = build_single if parsed.topology == "single" else build_graph
    return build(parsed, specs)


def build_graph(parsed: AppArgs, specs: list[ModelSpec]) -> Application:
    """Ingress -> ChatProcessor -> one LlamaModel-<id> per model, each deployment scaled on its own. Each
    model deployment's options are derived from its model entry (GPU, slots, autoscaling); Ray Serve applies
    a `deployments:` block of the config file on top, key by key, so the YAML wins."""
    models = {
        spec.id: LlamaModel.options(name=deployment_name(spec.id), **model_deployment_defaults(cfg))
        .bind(spec, parsed.tracing)
        for spec, cfg in zip(specs, parsed.models) if not spec.pool
    }
    # A pool's models have no deployment of their own: the pool's replicas load them (deployments/pool.py).
    configs = {p.name: p for p in parsed.pools}
    pools = {
        plan.name: LlamaPool.options(name=pool_deployment_name(plan.name),
                                     **pool_deployment_defaults(configs[plan.name], parsed.models))
        .bind(plan, [s for s in specs if s.pool == plan.name], parsed.tracing)
        for plan in pool_plans(parsed, specs)
    }
    # The processing's deployment holds the Responses store and the tenant ledger, in both shapes.
    processor = ChatProcessor.options(deployment_actors=processing_actors(parsed, specs))
    processor = processor.bind(specs, models, parsed.limits, parsed.auth, parsed.tracing, pools=pools,
                               channels=parsed.stream_channels, batch=parsed.batch)
    return GraphIngress.bind(processor, specs, parsed.limits, parsed.auth, parsed.tracing,
                             channels=parsed.stream_channels, batch=parsed.batch)


def build_single(parsed: AppArgs, specs: list[ModelSpec]) -> Application:
    """One Ingress replica that also renders prompts and runs the models' engines (and each pool's): it reserves
    what their LlamaModel and LlamaPool replicas would."""
    ingress = SingleIngress.options(**single_hosting_defaults(parsed),
                                    deployment_actors=processing_actors(parsed, specs))
    return ingress.bind(specs, parsed.limits, parsed.auth, parsed.tracing, pool_plans(parsed, specs),
                        batch=parsed.batch)


def processing_actors(parsed: AppArgs, specs: list[ModelSpec]) -> list[Any]:
    """The deployment actors of the deployment that runs the processing: the Responses store
    (deployments/response_store.py), the tenant ledger (deployments/tenant_ledger.py) and the batch runner
    (deployments/batch_runner.py)."""
    return response_store_actors(parsed.limits) + ledger_actors(parsed.auth) + runner_actors(parsed, specs)
