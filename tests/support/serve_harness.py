"""Start a real local Ray Serve from a serve config dict, the way `serve run <config>` does."""

from __future__ import annotations

import copy
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.config_overlay import merge, without_unused_deployments
from app.ray_env import local_ray_env

ROOT = Path(__file__).resolve().parents[2]
APP = "llamaray"
MODEL = "smollm2-135m"          # the bundled model, as serve_config.yaml names it
THINK_MODEL = "smollm2-think"   # the same GGUF read with the `think` reasoning parser (tests only)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_config(*overlays: dict[str, Any] | str) -> dict[str, Any]:
    """serve_config.yaml with overlays (paths relative to the repo, or dicts) merged in order."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    for overlay in overlays:
        data = yaml.safe_load((ROOT / overlay).read_text()) if isinstance(overlay, str) else overlay
        config = merge(config, copy.deepcopy(data))
    return without_unused_deployments(config)


class ServeCluster:
    def __init__(self, config: dict[str, Any], *, num_cpus: float | None = None, num_gpus: int | None = None,
                 timeout_s: float = 240, env: dict[str, str] | None = None, metrics_port: int | None = None,
                 address: str | None = None, require_healthy: bool = True, require_running: bool = True,
                 serve_local: bool = False) -> None:
        self.require_healthy = require_healthy  # False: RUNNING is enough (a model meant to be unavailable)
        # False (with require_healthy False): an HTTP answer from /health is enough (a model never placed)
        self.require_running = require_running
        self.address = address  # join a running cluster (e.g. an AutoscalingCluster) instead
        self.config = config
        self.metrics_port = metrics_port
        self.port = free_port()
        # serve_local: as `make run` (`llamaray serve-local`) starts it: Ray Serve's local settings, the
        # Ingress replica serving self.port itself and Serve's proxy on a free port nobody calls.
        self.serve_local = serve_local
        self.env = {**(local_ray_env(self.port) if serve_local else {}), **(env or {})}
        # The app's base URL, under its route_prefix (Serve mounts the app there).
        prefix = (config.get("applications") or [{}])[0].get("route_prefix") or "/"
        self.url = f"http://127.0.0.1:{self.port}{prefix.rstrip('/')}"
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.timeout_s = timeout_s

    def __enter__(self) -> "ServeCluster":
        import ray
        from ray.serve._private import api as serve_api
        from ray.serve.config import ProxyLocation
        from ray.serve.schema import ServeDeploySchema

        # Replicas inherit the environment Ray starts with (API keys come from there).
        self._saved_env = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        extra: dict[str, Any] = {}
        if self.metrics_port:
            extra = {"_metrics_export_port": self.metrics_port,
                     "_system_config": {"metrics_report_interval_ms": 500}}
        if self.address:
            ray.init(address=self.address, namespace="serve", log_to_driver=False)
        else:
            ray.init(num_cpus=self.num_cpus, num_gpus=self.num_gpus, include_dashboard=False,
                     namespace="serve", log_to_driver=False, **extra)
        client = serve_api.serve_start(http_options={"host": "127.0.0.1", "port": 0 if self.serve_local else self.port},
                                       proxy_location=ProxyLocation.HeadOnly)
        config = copy.deepcopy(self.config)
        config.pop("http_options", None)
        config["proxy_location"] = "HeadOnly"
        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=False)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)  # a failed start leaves no Ray behind for later tests
            raise
        return self

    def _wait_ready(self) -> None:
        from ray import serve

        deadline = time.monotonic() + self.timeout_s
        last = None
        while time.monotonic() < deadline:
            status = serve.status().applications.get(APP)
            last = status
            if status is not None and status.status == "DEPLOY_FAILED":
                details = "; ".join(f"{name}: {d.message}" for name, d in status.deployments.items() if d.message)
                raise RuntimeError(f"deploy failed: {status.message} {details}")
            if status is not None and status.status == "RUNNING" and (self.healthy() or not self.require_healthy):
                return
            if not self.require_running and not self.require_healthy and self.answers():
                return
            time.sleep(0.5)
        raise TimeoutError(f"app not ready after {self.timeout_s}s: {last}")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def answers(self) -> bool:
        """The app itself answers /health (JSON, whatever the status), not the proxy before it is routed."""
        try:
            return httpx.get(f"{self.url}/health", timeout=5).headers.get("content-type") == "application/json"
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return True
            time.sleep(0.5)
        return False

    def replicas(self, deployment: str) -> dict[str, int]:
        """Replica counts by state, as Serve's own status reports them."""
        from ray import serve

        app = serve.status().applications.get(APP)
        if app is None or deployment not in app.deployments:
            return {}
        return {getattr(k, "value", str(k)): v for k, v in app.deployments[deployment].replica_states.items()}

    def model_stats(self, model: str) -> dict[str, Any]:
        """`model`'s engine stats, from its LlamaModel replica or the Ingress that runs it (via the Ingress)."""
        return self.handle("Ingress").model_stats.remote(model).result()

    def handle(self, deployment: str):
        from ray import serve

        return serve.get_deployment_handle(deployment, app_name=APP)

    def __exit__(self, *exc: Any) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def sse_events(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    out = []
    for block in body.split("\n\n"):
        block = block.strip()
        if block:
            assert block.startswith("data: "), f"not an SSE data event: {block!r}"
            out.append(block[len("data: "):])
    return out


def sse_json(body: str) -> tuple[list[dict[str, Any]], list[str]]:
    events = sse_events(body)
    return [json.loads(e) for e in events if e != "[DONE]"], events
