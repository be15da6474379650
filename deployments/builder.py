"""The application builder named in serve_config.yaml: validated args -> deployment graph."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import deployment_name, parse_args, resolve_models
from app.placement import ingress_hosting_defaults, model_deployment_defaults
from app.preflight import preflight

from .chat_processor import ChatProcessor
from .ingress import Ingress
from .llama_model import LlamaModel


def build_app(args: dict[str, Any]) -> Application:
    parsed = parse_args(args)
    specs = resolve_models(parsed)
    for spec in specs:
        preflight(spec)
    # The resolved specs and validated configs go to the replicas as they are (they pickle).
    # Each model deployment's options are derived from its model entry (GPU, slots, autoscaling); Ray
    # Serve applies a `deployments:` block of the config file on top, key by key, so the YAML wins.
    if parsed.llama_model == "ingress":  # the engines run in the Ingress replica (chat_processor: ingress too)
        return Ingress.options(**ingress_hosting_defaults(parsed.models)).bind(None, specs, None, parsed.limits,
                                                                               parsed.auth)
    models = {
        spec.id: LlamaModel.options(name=deployment_name(spec.id), **model_deployment_defaults(cfg)).bind(spec)
        for spec, cfg in zip(specs, parsed.models)
    }
    # chat_processor: ingress runs the ChatProcessor's work inside the Ingress (no deployment of its own).
    processor = ChatProcessor.bind(specs, models, parsed.limits) if parsed.chat_processor == "deployment" else None
    return Ingress.bind(processor, specs, models, parsed.limits, parsed.auth)
