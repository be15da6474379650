"""Ray Serve settings for a single small machine (`make run`, the benchmark), as environment variables
Ray's processes read when they start. Measured on 2 cores (README, "Benchmark"):

- RAY_SERVE_THROUGHPUT_OPTIMIZED=1: handles over gRPC, the Ingress replica serving HTTP itself (direct
  ingress), user code and the router on the replica's main event loop, GC frozen after start-up.
  Together with `chat_processor: ingress`, c=1 went from 48-75 to 84-100 tok/s.
- The Ingress replica's HTTP server on the port users call (`http_options.port`): Serve gives direct
  ingress replicas ports from RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT (30000 up by default, and a
  released port held back for a while), so the range is that one port, nothing is held back, and Serve's
  own proxy, which would otherwise relay every request and streamed chunk over Ray, listens on a free
  port nobody calls (`proxy_aside`). One Ingress replica per machine: a second could not bind the port.
- RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1: the Serve controller wakes every 1 s instead of 0.1 s (idle CPU
  taken from llama.cpp); autoscaling and health decisions react within a second instead of 0.1 s.
- RAY_SERVE_LOG_TO_STDERR=1: keeps replica logs (llamaray's own lines: why a model cannot be placed or
  run) in `serve run`'s terminal, which the throughput preset would turn off.

Clusters keep Ray's defaults: set these in the nodes' environment (`ray start`) if wanted there too.
"""

from __future__ import annotations

import copy
import errno
import socket
from typing import Any

LOCAL_RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    "RAY_SERVE_LOG_TO_STDERR": "1",
}
DEFAULT_HTTP_PORT = 8000  # Ray Serve's, when a config names none


def local_ray_env(port: int) -> dict[str, str]:
    """LOCAL_RAY_ENV, with the Ingress replica serving HTTP on `port` itself."""
    return {**LOCAL_RAY_ENV,
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),  # exclusive: the range is `port` alone
            "RAY_SERVE_PORT_QUARANTINE_S": "0"}


def http_endpoint(config: dict[str, Any]) -> tuple[str, int]:
    """(host, port) a serve config's clients call."""
    http = config.get("http_options") or {}
    return str(http.get("host", "127.0.0.1")), int(http.get("port", DEFAULT_HTTP_PORT))


def proxy_aside(config: dict[str, Any]) -> dict[str, Any]:
    """The config with Serve's proxy on a free port (0), leaving `http_options.port` to the Ingress replica."""
    out = copy.deepcopy(config)
    out.setdefault("http_options", {})["port"] = 0
    return out


def port_free(host: str, port: int) -> str | None:
    """None if `host:port` can be bound now, else why not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else str(exc)
    return None
