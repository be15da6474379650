"""Ray Serve settings for a single small machine (`make run`, the benchmark), as environment variables
Ray's processes read when they start. Measured on 2 cores (README, "Benchmark"):

- RAY_SERVE_THROUGHPUT_OPTIMIZED=1: handles over gRPC, the Ingress replica serving HTTP itself (direct
  ingress: no proxy hop), user code and the router on the replica's main event loop, GC frozen after
  start-up. Together with `chat_processor: ingress`, c=1 went from 48-75 to 84-100 tok/s.
- RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1: the Serve controller wakes every 1 s instead of 0.1 s (idle CPU
  taken from llama.cpp); autoscaling and health decisions react within a second instead of 0.1 s.
- RAY_SERVE_LOG_TO_STDERR=1: keeps replica logs (llamaray's own lines: why a model cannot be placed or
  run) in `serve run`'s terminal, which the throughput preset would turn off.

Clusters keep Ray's defaults: set these in the nodes' environment (`ray start`) if wanted there too.
"""

from __future__ import annotations

LOCAL_RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    "RAY_SERVE_LOG_TO_STDERR": "1",
}
