"""The application builder named in serve_config.yaml: validated args -> deployment graph."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import deployment_name, parse_args, resolve_models
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
    models = {
        spec.id: LlamaModel.options(name=deployment_name(spec.id), max_ongoing_requests=spec.n_seq_max).bind(spec)
        for spec in specs
    }
    processor = ChatProcessor.bind(specs, models, parsed.limits)
    return Ingress.bind(processor, specs, models, parsed.limits, parsed.auth)
