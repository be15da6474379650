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
    models = {
        spec.id: LlamaModel.options(name=deployment_name(spec.id), max_ongoing_requests=spec.n_seq_max)
        .bind(spec.to_dict())
        for spec in specs
    }
    spec_dicts = [s.to_dict() for s in specs]
    processor = ChatProcessor.bind(spec_dicts, models, parsed.limits.model_dump())
    return Ingress.bind(processor, spec_dicts, models, parsed.limits.model_dump(), parsed.auth.model_dump())
