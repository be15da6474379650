"""What a replica says about itself: process, node, Serve replica id, reserved resources (placement and fault
tests)."""

from __future__ import annotations

import os
from typing import Any

import ray
from ray import serve


def replica_info() -> dict[str, Any]:
    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "replica_id": serve.get_replica_context().replica_id.unique_id,
            "node_id": context.get_node_id(), "resources": context.get_assigned_resources()}
