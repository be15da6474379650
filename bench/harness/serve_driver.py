"""python -m bench.harness.serve_driver CONFIG --num-gpus N --num-cpus N: a local Ray head with logical GPUs
and the serve config deployed on it, as `serve run` would, but declaring GPUs a CPU-only machine does
not have (model replicas that reserve `num_gpus: 1` are then placed one per logical GPU) and saying
when every replica is up: it prints READY once Serve reports the application RUNNING with each
deployment at its target replica count (after a line `GCS <address>`: where another driver connects).
SIGINT or SIGTERM shuts Serve and Ray down.

Started by bench/harness/servers.py's ServeDriverServer (`python -m bench.router`, `bench.graph`, `bench.pool`),
which gives it its own RAY_TMPDIR.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.serve_driver")
    p.add_argument("config", type=Path)
    p.add_argument("--num-gpus", type=int, default=2)
    p.add_argument("--num-cpus", type=float, default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--metrics-port", type=int, default=None,
                   help="export Ray's metrics (the app's llamaray_* among them) in Prometheus' format on this port")
    ns = p.parse_args(argv)
    config = yaml.safe_load(ns.config.read_text())
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    import ray
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.config import ProxyLocation
    from ray.serve.schema import ServeDeploySchema

    metrics = ({"_metrics_export_port": ns.metrics_port, "_system_config": {"metrics_report_interval_ms": 500}}
               if ns.metrics_port else {})
    context = ray.init(num_cpus=ns.num_cpus, num_gpus=ns.num_gpus, include_dashboard=False, namespace="serve",
                       **metrics)
    # Where another driver finds this cluster (`address="auto"` could pick another one on the machine).
    print(f"GCS {context.address_info['gcs_address']}", flush=True)
    try:
        http = config.pop("http_options", {}) or {}
        client = serve_api.serve_start(http_options={"host": http.get("host", "127.0.0.1"),
                                                     "port": int(http.get("port", 8000))},
                                       proxy_location=ProxyLocation.HeadOnly)
        config["proxy_location"] = "HeadOnly"
        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=False)
        names = [a["name"] for a in config["applications"]]
        deadline = time.monotonic() + ns.timeout
        while True:
            apps = serve.status().applications
            states = {n: apps[n].status for n in names if n in apps}
            if any(s == "DEPLOY_FAILED" for s in states.values()):
                print(f"DEPLOY FAILED: {[apps[n].message for n in names if n in apps]}", flush=True)
                return 1
            if len(states) == len(names) and all(s == "RUNNING" for s in states.values()):
                counts = {f"{n}/{d}": dict(st.replica_states) for n in names for d, st in apps[n].deployments.items()}
                print(f"READY {counts}", flush=True)
                break
            if time.monotonic() > deadline:
                print(f"NOT READY after {ns.timeout:.0f} s: {states}", flush=True)
                return 1
            time.sleep(0.5)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
