"""What every replica of the app does first (tracing, the garbage collector's pace), and what it says about itself:
process, node, Serve replica id, reserved resources, the collector (placement, fault and GC tests)."""

from __future__ import annotations

import os
from typing import Any

import ray
from ray import serve

from app.config.settings import TracingConfig
from app.observe import tracing
from app.ops.gc_tuning import gc_info, tune_for_serving


def start_replica(tracing_config: TracingConfig | None) -> None:
    """A replica's constructor calls this first: its spans exported as configured, and its collector tuned for
    streaming (app/ops/gc_tuning.py); Serve freezes what the constructor allocated once it returns."""
    tracing.configure(tracing_config)
    tune_for_serving()


def replica_info() -> dict[str, Any]:
    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "replica_id": serve.get_replica_context().replica_id.unique_id,
            "node_id": context.get_node_id(), "resources": context.get_assigned_resources(), "gc": gc_info()}
