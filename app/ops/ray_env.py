"""Ray Serve settings for a single small machine (`make run`, the benchmark), as environment variables
Ray's processes read when they start. Each was measured on 2 cores (docs/history/benchmarks-2026.md):

- RAY_SERVE_THROUGHPUT_OPTIMIZED=1: handles over gRPC, the Ingress replica serving HTTP itself (direct
  ingress), user code and the router on the replica's main event loop, GC frozen after start-up:
  fewer threads and hops taking CPU from llama.cpp's.
- The Ingress replica's HTTP server on the port users call (`http_options.port`): Serve gives direct
  ingress replicas ports from RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT (30000 up by default, and a
  released port held back for a while), so the range is that one port, nothing is held back, and Serve's
  own proxy, which would otherwise relay every request and streamed chunk over Ray, listens on a free
  port nobody calls (`proxy_aside`). One Ingress replica per machine: a second could not bind the port.
- RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1: the Serve controller wakes every 1 s instead of 0.1 s (idle CPU
  taken from llama.cpp); autoscaling and health decisions react within a second instead of 0.1 s.
- RAY_SERVE_LOG_TO_STDERR=1: keeps replica logs (llamaray's own lines: why a model cannot be placed or
  run) in `serve run`'s terminal, which the throughput preset would turn off.
- PROXY_ENV (app/ops/gc_tuning.py): Serve's proxy collects garbage at the replicas' pace; it relays nothing
  here, but the same setting holds wherever the proxy runs.
- QUIET_RAY_ENV: Ray's own periodic work slowed, or off where nothing local reads it. Each time one of Ray's
  processes wakes it takes a core from one of llama.cpp's threads in the middle of a decode, and the other
  thread spins at its next barrier until it comes back: stopping Ray's background processes during a
  measured stream took `make run` from 45 to 58.6 tok/s on 2 cores (docs/history/benchmarks-2026.md). Ray's dashboard is
  off for the same reason (`serve-local --dashboard` starts it).

The user's environment wins over each of these settings, except the port range, which is the config's.

Clusters start Ray with CLUSTER_RAY_ENV (below) instead: the front door and the throughput settings, not the
single-port, controller and quiet settings of a small machine.
"""

from __future__ import annotations

import copy
import errno
import socket
from collections.abc import Mapping
from typing import Any

from .gc_tuning import PROXY_ENV

LOCAL_RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    "RAY_SERVE_LOG_TO_STDERR": "1",
    # No load balancer to drain a local replica for: a replaced Ingress replica goes at once.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    **PROXY_ENV,
}
# What a cluster's nodes start Ray with (cluster.yaml's `ray start`, the KubeRay manifest's pods; `serve-local` has
# its own front door). RAY_SERVE_ENABLE_HA_PROXY=1: each node's front door on `http_options.port` is HAProxy,
# which passes a request's bytes to an Ingress replica's own HTTP server (Serve's direct ingress), instead of
# Serve's Python proxy relaying each request and each streamed chunk over Ray. With the synthetic H200-pace
# model on 2 cores it served 256 streams at 0.18 cores per 1,000 tok/s against 0.48, adding 40 ms to TTFT against
# 870 (docs/history/benchmarks-2026.md); Ray's guide for high-throughput Serve on KubeRay sets it. The Ingress replicas then
# listen on ports from Serve's range (30000 up) on every interface, for HAProxy on other nodes.
#
# RAY_SERVE_THROUGHPUT_OPTIMIZED=1 as Ray's guide sets it beside HAProxy: each replica runs our code and Serve's
# router on its main event loop (no hand-off between three loops per request and streamed item), handles over gRPC,
# replica logs to Serve's log files only (each replica's log lines no longer go through its stderr, the log monitor
# and the GCS). Through HAProxy at 256 streams it took a quarter off the Ingress's CPU per token and two thirds off
# the inter-chunk delay the graph adds (docs/history/benchmarks-2026.md). Serve's log files are written at each record
# (RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE=1, Ray's default), not in 1,000-record batches as the preset would:
# llamaray's warnings (a model that cannot be placed, a fetch that failed) show up when they happen.
#
# RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5 (Ray: 0.1): the Serve controller's loop, and the GCS calls each round
# makes, were a third of an idle graph's CPU (0.044 + 0.015 of 0.147 cores; 0.014 + 0.006 at 0.5). Autoscaling
# and health-check delays are counted in seconds, not rounds, so they keep their meaning; a new or dead replica
# reaches the routers and HAProxy up to 0.4 s later. The log monitor settings are QUIET_RAY_ENV's (below): with
# replica logs in files only, it follows few files, and a new worker's file is found within 2 s.
CLUSTER_RAY_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "2",
    **PROXY_ENV,
}
# Ray's defaults in the comments (src/ray/common/ray_config_def.h).
QUIET_RAY_ENV = {
    "RAY_enable_task_events": "0",                              # on: the dashboard's task and actor views
    "RAY_event_stats": "0",                                     # on: per-handler timings of Ray's event loops
    "RAY_raylet_report_resources_period_milliseconds": "1000",  # 100: one node whose resources do not change
    "RAY_raylet_check_gc_period_milliseconds": "1000",          # 100
    "RAY_memory_monitor_refresh_ms": "1000",                    # 250: the OOM killer still looks every second
    "RAY_kill_idle_workers_interval_ms": "1000",                # 200: a local server starts no task workers
    # The log monitor (replica logs to the terminal) looks for new log files every 2 s instead of at each of its
    # ten polls a second (Ray does so below 1,000 files): half its idle CPU; a new replica's first lines show up
    # to 2 s late. Lines of files it follows still come within 0.1 s.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "2",
}
DEFAULT_HTTP_PORT = 8000  # Ray Serve's, when a config names none


def local_ray_env(port: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """LOCAL_RAY_ENV and QUIET_RAY_ENV where `environ` (the user's) does not set them, with the Ingress replica
    serving HTTP on `port` itself."""
    environ = {} if environ is None else environ
    return {**{k: v for k, v in {**LOCAL_RAY_ENV, **QUIET_RAY_ENV}.items() if k not in environ},
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


def port_state(host: str, port: int) -> str:
    """`free`: the Ingress replica can bind it, as it binds (SO_REUSEADDR, deployments/direct_ingress.py: the
    closing connections an earlier server left, TCP TIME_WAIT, do not stand in the way); else why not (`in
    use`: another socket listens there)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else str(exc)
    return "free"
