"""Replica counts per Serve deployment, polled from the Ray dashboard's REST API.

`GET {dashboard}/api/serve/applications/` returns Ray's `ServeInstanceDetails`
(ray/serve/schema.py): applications -> deployments -> replicas, each replica with a `state`
(STARTING, UPDATING, RECOVERING, RUNNING, STOPPING, ...) and each deployment with the autoscaler's
`target_num_replicas`. Plain httpx and dicts, no `ray` import: the load test also runs where
only the HTTP endpoint is reachable, and then simply has no replica data.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
PATH = "/api/serve/applications/"
# Replicas that are coming up: started by the autoscaler but not serving yet.
STARTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING"})


@dataclass(frozen=True)
class DeploymentReplicas:
    running: int
    starting: int
    target: int | None
    status: str | None
    states: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"running": self.running, "starting": self.starting, "target": self.target,
                "status": self.status, "states": dict(self.states)}


def deployment_key(app: str, deployment: str) -> str:
    return f"{app}/{deployment}"


def parse_replicas(payload: Any) -> dict[str, DeploymentReplicas]:
    """`{"<app>/<deployment>": DeploymentReplicas}` from a /api/serve/applications/ body.
    Tolerates missing or odd fields (other Ray versions): what cannot be read is left out."""
    out: dict[str, DeploymentReplicas] = {}
    apps = payload.get("applications") if isinstance(payload, dict) else None
    if not isinstance(apps, dict):
        raise ValueError("no 'applications' object in the response")
    for app_name, app in apps.items():
        deployments = app.get("deployments") if isinstance(app, dict) else None
        if not isinstance(deployments, dict):
            continue
        for dep_name, dep in deployments.items():
            if not isinstance(dep, dict):
                continue
            replicas = dep.get("replicas") or []
            states = Counter(str(r.get("state")) for r in replicas if isinstance(r, dict))
            target = dep.get("target_num_replicas")
            out[deployment_key(str(app_name), str(dep.get("name") or dep_name))] = DeploymentReplicas(
                running=states.get("RUNNING", 0),
                starting=sum(n for s, n in states.items() if s in STARTING_STATES),
                target=target if isinstance(target, int) else None,
                status=dep.get("status") if isinstance(dep.get("status"), str) else None,
                states=dict(sorted(states.items())),
            )
    return out


def ray_auth_headers() -> dict[str, str]:
    """Ray's dashboard token, when this machine has one (Ray 2.60 turns token auth on for
    clusters that `serve run` starts): $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        try:
            token = path.read_text().strip()
        except OSError:
            return {}
    return {"Authorization": f"Bearer {token}"} if token else {}


class ServePoller:
    """Polls the dashboard every `interval_s` and hands each successful sample to `on_sample`.
    A failed poll is counted and remembered (`last_error`), never raised: no Serve, no data."""

    def __init__(self, dashboard_url: str, interval_s: float = 1.0, *,
                 timeout_s: float | None = None, client: httpx.AsyncClient | None = None) -> None:
        self.url = dashboard_url.rstrip("/") + PATH
        self.interval_s = interval_s
        # The endpoint asks the Serve controller; allow it a little longer than one interval.
        self.timeout_s = timeout_s if timeout_s is not None else max(2.0, 2 * interval_s)
        self._client = client
        self.headers = ray_auth_headers()
        self.n_ok = 0
        self.n_failed = 0
        self.last_error: str | None = None

    async def poll_once(self) -> dict[str, DeploymentReplicas] | None:
        client = self._client or httpx.AsyncClient(timeout=self.timeout_s)
        try:
            resp = await client.get(self.url, timeout=self.timeout_s, headers=self.headers)
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            sample = parse_replicas(resp.json())
        except (httpx.HTTPError, OSError, ValueError) as exc:   # JSON errors are ValueErrors
            self.n_failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        finally:
            if self._client is None:
                await client.aclose()
        self.n_ok += 1
        return sample

    async def run(self, on_sample: Callable[[float, dict[str, DeploymentReplicas]], None],
                  stop: asyncio.Event, clock: Callable[[], float] = time.perf_counter) -> None:
        """Poll until `stop` is set; `on_sample(clock time, sample)` for each successful poll."""
        own = self._client is None
        if own:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            while not stop.is_set():
                started = clock()
                sample = await self.poll_once()
                if sample is not None:
                    on_sample(clock(), sample)
                wait = self.interval_s - (clock() - started)
                try:
                    await asyncio.wait_for(stop.wait(), max(wait, 0.01))
                except asyncio.TimeoutError:
                    pass
        finally:
            if own and self._client is not None:
                await self._client.aclose()
                self._client = None

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "polls_ok": self.n_ok, "polls_failed": self.n_failed,
                "last_error": self.last_error}
