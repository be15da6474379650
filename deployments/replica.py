"""What every replica of the app does first (tracing, the garbage collector's pace), and what it says about itself:
process, node, Serve replica id, reserved resources, the collector (placement, fault and GC tests)."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray import serve
from ray.serve._private.constants import SERVE_LOGGER_NAME

from app.config.app_args import TracingConfig
from app.observe import tracing
from app.observe.refusals import RefusalFilter
from app.ops.gc_tuning import gc_info, tune_for_serving


def start_replica(tracing_config: TracingConfig | None) -> None:
    """A replica's constructor calls this first: its spans exported as configured, its collector tuned for
    streaming (app/ops/gc_tuning.py; Serve freezes what the constructor allocated once it returns), and Serve's
    traceback of each refusal a method raises left out of its log (the Ingress logs each refusal as one line)."""
    tracing.configure(tracing_config)
    tune_for_serving()
    replica_logs()


def replica_logs() -> None:
    """The app's log (`llamaray.*`, INFO and up) written where Serve writes this replica's (its log file, and the
    console where Serve's settings send it), with Serve's context; and Serve's "Request failed." traceback, which
    it logs at ERROR for every exception a deployment's method raises, a 429 or a 404 as much as a crash, left
    out for refusals (app/observe/refusals.py: the Ingress logs each as one INFO line). Once per process."""
    serve_log = logging.getLogger(SERVE_LOGGER_NAME)
    if not any(isinstance(f, RefusalFilter) for f in serve_log.filters):
        serve_log.addFilter(RefusalFilter())
    app_log = logging.getLogger("llamaray")
    if not app_log.handlers and serve_log.handlers:
        app_log.setLevel(logging.INFO)
        for handler in serve_log.handlers:
            app_log.addHandler(handler)
        app_log.propagate = False


def replica_info() -> dict[str, Any]:
    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "replica_id": serve.get_replica_context().replica_id.unique_id,
            "node_id": context.get_node_id(), "resources": context.get_assigned_resources(), "gc": gc_info()}
