"""This node's Prometheus export, for the Ingress's /metrics (app/http/metrics_page.py chooses what of it a key
reads). Ray's metrics agent on each node exports every Ray process's metrics on the node, our replicas' included,
on the node's `metrics_export_port` (`ray start --metrics-export-port`; a free port when not set). The node's address
and port are read from the GCS node table (`ray.nodes()`, the entry of this replica's node), as Ray's own Prometheus
service discovery file lists them, once, and again after a failed read (a node restarted on another port)."""

from __future__ import annotations

import asyncio

import httpx
import ray

READ_TIMEOUT_S = 5.0


def node_export_url() -> str:
    """Where this node's metrics agent serves its export."""
    node_id = ray.get_runtime_context().get_node_id()
    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
    port = (node or {}).get("MetricsExportPort")
    if not port or port <= 0:
        raise RuntimeError("this node's Ray has no metrics export port (metrics collection is off)")
    address = node["NodeManagerAddress"]
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/metrics"


class NodeExport:
    """`read()`: the node's exposition text."""

    def __init__(self) -> None:
        self.url: str | None = None

    async def read(self) -> str:
        if self.url is None:
            self.url = await asyncio.to_thread(node_export_url)
        try:
            async with httpx.AsyncClient(timeout=READ_TIMEOUT_S) as client:
                response = await client.get(self.url, headers={"Accept": "text/plain"})
                response.raise_for_status()
                return response.text
        except Exception:
            self.url = None  # found again next time
            raise
