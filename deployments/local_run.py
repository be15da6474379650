"""`llamaray serve-local`'s driver (`make run`): Ray Serve on this machine, started and watched the way a
local tool should be.

- Ray, Serve and the config's applications start in this process (what `serve run` does), with Serve's
  proxy on a free port: the Ingress replica serves `http_options.port` itself (app/ops/ray_env.py).
- A deployment that cannot start (the port taken, keys required and missing, a config error) ends the
  run with the deployment's own message and exit status 1, instead of a driver that keeps running while
  nothing serves.
- Ray's dashboard starts only with `--dashboard` (app/ops/ray_env.py says why); once every application runs,
  Serve's status is read every few seconds instead of every second, for the same reason.
- Ctrl-C (or SIGTERM) stops everything at once: the local Ray dies with this process, so there is
  nothing to drain, and no request survives a local server's exit anyway.

    python -m deployments.local_run [--dashboard] build/serve_local.run.yaml
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

# Serve gives up on a deployment whose replicas keep failing to start. (UNHEALTHY is left out: Serve
# replaces replicas that fail while serving, and the run goes on.)
APP_STATES_FAILED = ("DEPLOY_FAILED",)


def _status_name(value: Any) -> str:
    return str(getattr(value, "value", value))


def failure_message(app_name: str, status: Any) -> str:
    """Why an application failed, in its deployments' own words."""
    lines = [f"llamaray: application {app_name!r} failed to start: {status.message.strip() or _status_name(status.status)}"]
    for name, dep in status.deployments.items():
        if dep.message and _status_name(dep.status) != "HEALTHY":
            lines.append(f"  {name}: {dep.message.strip()}")
    return "\n".join(lines)


def run(config: dict[str, Any], *, poll_s: float = 1.0, running_poll_s: float = 5.0, dashboard: bool = False) -> int:
    import ray
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.config import ProxyLocation
    from ray.serve.schema import ServeDeploySchema

    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    ray.init(namespace="serve", include_dashboard=dashboard)
    try:
        http = config.get("http_options") or {}
        client = serve_api.serve_start(http_options={"host": http.get("host", "127.0.0.1"), "port": http.get("port", 0)},
                                       proxy_location=ProxyLocation.HeadOnly)
        deploy = {k: v for k, v in config.items() if k not in ("http_options", "proxy_location")}
        client.deploy_apps(ServeDeploySchema.model_validate({**deploy, "proxy_location": "HeadOnly"}))
        names = [app["name"] for app in config.get("applications") or []]
        running: set[str] = set()
        while not stop:
            apps = serve.status().applications
            for name in names:
                status = apps.get(name)
                state = _status_name(status.status) if status is not None else "NOT_STARTED"
                if state in APP_STATES_FAILED:
                    print(failure_message(name, status), file=sys.stderr, flush=True)
                    return 1
                if state == "RUNNING" and name not in running:
                    running.add(name)
                    print(f"llamaray: application {name!r} is running", flush=True)
            time.sleep(running_poll_s if running.issuperset(names) else poll_s)
        return 0
    finally:
        print("llamaray: stopping", flush=True)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dashboard = "--dashboard" in args
    args = [a for a in args if a != "--dashboard"]
    if len(args) != 1:
        print("usage: python -m deployments.local_run [--dashboard] <serve config>", file=sys.stderr)
        return 2
    return run(yaml.safe_load(Path(args[0]).read_text()) or {}, dashboard=dashboard)


if __name__ == "__main__":
    sys.exit(main())
