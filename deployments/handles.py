"""How the graph's deployments call each other: each request and each streamed item goes by value over
the replica's gRPC channel (Ray Serve's `_by_reference=False`, what RAY_SERVE_USE_GRPC_BY_DEFAULT makes
the default), not as a Ray object reference through the object store and the owner's bookkeeping.
`python -m bench.graph` measured the difference at GPU speed: the CPU each streamed chunk costs the
ChatProcessor, the model replica and Ray's own processes about halves, on any cluster, whatever its
nodes' environment. Values that cross must pickle (they do: docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from ray.serve.handle import DeploymentHandle


def by_value(handle: DeploymentHandle, **options: Any) -> DeploymentHandle:
    return handle.options(_by_reference=False, **options)
